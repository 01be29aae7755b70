// Command apimux runs inside the qemu guest of the agent's and the CSI
// driver's guest suites (agents/agent/guest_test.go, csi/guest_test.go build
// it with CGO_ENABLED=0 and ship it through the 9p share). It connects once
// to -upstream (the guestfwd address, whose host end is an apimux.Demux),
// listens on -listen (the kubeconfig in the guest points there) and carries
// every accepted connection as a framed stream over that one connection; see
// package test/kernel/apimux for the frame format.
//
//	apimux [-listen 127.0.0.1:6443] [-upstream 10.0.2.100:6443]
//
// It exits non-zero when the upstream connection ends or breaks.
package main

import (
	"flag"
	"log"
	"net"

	"github.com/plinth-storage/plinth/test/kernel/apimux"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:6443", "local address for API clients")
	upstream := flag.String("upstream", "10.0.2.100:6443", "the guestfwd address")
	flag.Parse()
	up, err := net.Dial("tcp", *upstream)
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(apimux.Mux(l, up))
}
