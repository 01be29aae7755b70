// Command svcforward runs in the guest nodes of test/kernel/guestnode, which have no cluster
// DNS: /etc/hosts maps a Service's DNS name (the key server's, which the shipped agent and
// node plugin name in --key-server) to 127.0.0.1, and svcforward listens there on the Service's
// port and carries each connection to the Service's ClusterIP, where kube-proxy's rules send
// it on to a ready endpoint — what resolving the name through cluster DNS gives a real node.
// Not part of Plinth.
//
//	svcforward -listen 127.0.0.1:8443 -to 10.0.0.17:8443
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8443", "address the Service's name resolves to in the guest")
	to := flag.String("to", "", "the Service's ClusterIP:port")
	flag.Parse()
	if *to == "" {
		log.Fatal("-to is required")
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer c.Close()
			up, err := net.DialTimeout("tcp", *to, 10*time.Second)
			if err != nil {
				log.Printf("dial %s: %v", *to, err)
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }() //nolint:errcheck
			go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()  //nolint:errcheck
			<-done
			<-done
		}()
	}
}
