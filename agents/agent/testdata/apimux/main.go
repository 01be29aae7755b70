// Command apimux runs inside the qemu guest of the agent's guest suite. qemu's
// guestfwd to a host socket carries ONE byte stream for the guest's whole
// life, so every connection to the API server is multiplexed over it:
// apimux listens on -listen (the agent's kubeconfig points there) and
// carries each accepted connection as a stream of frames over one
// connection to -upstream, where the test's host side demultiplexes them.
//
// Frame: 4-byte stream id, 1-byte type (0 open, 1 data, 2 close), 4-byte
// length, payload (big endian).
package main

import (
	"encoding/binary"
	"flag"
	"io"
	"log"
	"net"
	"sync"
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
	var (
		wmu   sync.Mutex
		mu    sync.Mutex
		conns = map[uint32]net.Conn{}
		next  uint32
	)
	send := func(id uint32, typ byte, p []byte) error {
		var h [9]byte
		binary.BigEndian.PutUint32(h[0:], id)
		h[4] = typ
		binary.BigEndian.PutUint32(h[5:], uint32(len(p)))
		wmu.Lock()
		defer wmu.Unlock()
		if _, err := up.Write(h[:]); err != nil {
			return err
		}
		_, err := up.Write(p)
		return err
	}
	go func() { // upstream → local connections
		var h [9]byte
		for {
			if _, err := io.ReadFull(up, h[:]); err != nil {
				log.Fatalf("upstream: %v", err)
			}
			id, typ, n := binary.BigEndian.Uint32(h[0:]), h[4], binary.BigEndian.Uint32(h[5:])
			p := make([]byte, n)
			if _, err := io.ReadFull(up, p); err != nil {
				log.Fatalf("upstream: %v", err)
			}
			mu.Lock()
			c := conns[id]
			if typ == 2 {
				delete(conns, id)
			}
			mu.Unlock()
			if c == nil {
				continue
			}
			if typ == 2 {
				c.Close()
				continue
			}
			c.Write(p)
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		mu.Lock()
		next++
		id := next
		conns[id] = c
		mu.Unlock()
		if err := send(id, 0, nil); err != nil {
			log.Fatal(err)
		}
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if send(id, 1, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					send(id, 2, nil)
					return
				}
			}
		}()
	}
}
