// Package netrelay is the private network between two kernel-test guests: each guest has a
// virtio NIC on a qemu socket netdev in UDP mode (one Ethernet frame per datagram, no
// framing), and this relay on the host forwards the frames of one guest to the other. The
// test controls the link from the host: Cut drops every frame in both directions (a pulled
// cable: the guests' links stay up, their packets vanish), Restore forwards again, SetDelay
// holds each frame for a fixed time before forwarding it (order kept per direction).
//
// Nothing leaves the machine: every socket is on 127.0.0.1. The guests keep their own
// addresses (assigned in the guest on the NIC with the MAC the relay names), so what runs
// between them — ARP, TCP, nvme-tcp — is the guests' kernels' own traffic.
//
// qemu's side (qemu-system-x86_64 7.2, docs "-netdev socket ... udp=host:port,
// localaddr=host:port"): qemu binds localaddr and sends each frame to udp=. The relay owns
// one socket per side (the udp= address) and sends the frames of the other side from it to
// that side's localaddr.
package netrelay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// maxFrame bounds one datagram: qemu's socket netdev offers no offloads to the guest, so a
// frame is at most the MTU (1500) plus the Ethernet header; 64 KiB leaves room for any MTU.
const maxFrame = 65536

// Side is one guest's end of the link.
type Side struct {
	// GuestPort is the UDP port on 127.0.0.1 that this side's qemu binds (localaddr).
	GuestPort int
	// RelayPort is the relay's UDP port on 127.0.0.1 that this side's qemu sends to (udp=).
	RelayPort int
	// MAC is the guest NIC's MAC address, e.g. 52:54:00:77:00:01.
	MAC string

	conn *net.UDPConn
	to   *net.UDPAddr
}

// NetdevArgs returns the qemu arguments of this side's NIC: a socket netdev in UDP mode and
// a virtio-net-pci device with the side's MAC. id names the netdev (unique per qemu).
func (s *Side) NetdevArgs(id string) []string {
	return []string{
		"-netdev", fmt.Sprintf("socket,id=%s,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", id, s.RelayPort, s.GuestPort),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, s.MAC),
	}
}

// Counts are the relay's frame counters since Start, per direction (A→B, B→A).
type Counts struct {
	// ForwardedAB, ForwardedBA count frames delivered to the other side.
	ForwardedAB, ForwardedBA int64
	// DroppedAB, DroppedBA count frames dropped while the link was cut (or its queue full).
	DroppedAB, DroppedBA int64
	// LostAB, LostBA count frames the relay's socket could not send (the other qemu not
	// running, e.g. rebooting): lost as on a wire with no peer.
	LostAB, LostBA int64
}

// Relay forwards Ethernet frames between side A and side B.
type Relay struct {
	// A and B are the two sides; give each to its guest's qemu (NetdevArgs).
	A, B *Side

	cut   atomic.Bool
	delay atomic.Int64 // nanoseconds

	fwd  [2]atomic.Int64
	drop [2]atomic.Int64
	lost [2]atomic.Int64

	scan atomic.Pointer[scan] // Scan's pattern and count, nil when nobody scans

	wg     sync.WaitGroup
	closed chan struct{}
	once   sync.Once
}

// freeUDPPort returns a UDP port on 127.0.0.1 that was free a moment ago (qemu binds it
// itself, so the relay cannot hold it open).
func freeUDPPort() (int, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

// Start opens the relay's two sockets and starts forwarding. macA and macB are the MACs the
// guests' NICs get. Close stops it.
func Start(macA, macB string) (*Relay, error) {
	r := &Relay{closed: make(chan struct{})}
	sides := make([]*Side, 2)
	for i, mac := range []string{macA, macB} {
		if _, err := net.ParseMAC(mac); err != nil {
			r.Close()
			return nil, fmt.Errorf("netrelay: side %d: %w", i, err)
		}
		gp, err := freeUDPPort()
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("netrelay: guest port: %w", err)
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("netrelay: relay socket: %w", err)
		}
		sides[i] = &Side{GuestPort: gp, RelayPort: c.LocalAddr().(*net.UDPAddr).Port, MAC: mac, conn: c,
			to: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: gp}}
		if i == 0 {
			r.A = sides[0]
		} else {
			r.B = sides[1]
		}
	}
	r.wg.Add(2)
	go r.forward(0, r.A, r.B)
	go r.forward(1, r.B, r.A)
	return r, nil
}

type frame struct {
	at   time.Time
	data []byte
}

// forward reads frames arriving from side from and sends them to side to, dropping them while
// the link is cut. With a delay a second goroutine sends each frame when its time has come, so
// the reader never blocks and order is kept.
func (r *Relay) forward(dir int, from, to *Side) {
	defer r.wg.Done()
	q := make(chan frame, 4096)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for f := range q {
			if d := time.Duration(r.delay.Load()); d > 0 {
				if wait := time.Until(f.at.Add(d)); wait > 0 {
					select {
					case <-time.After(wait):
					case <-r.closed:
						return
					}
				}
			}
			if r.cut.Load() { // cut while the frame was held
				r.drop[dir].Add(1)
				continue
			}
			// Counted before the send: the other side may read the frame the moment the
			// write is done, and whoever holds a delivered frame must find it counted.
			r.fwd[dir].Add(1)
			if _, err := to.conn.WriteToUDP(f.data, to.to); err != nil {
				// a send error (the other qemu is not running, e.g. rebooting) is a lost
				// frame, as on a wire
				r.fwd[dir].Add(-1)
				r.lost[dir].Add(1)
			}
		}
	}()
	defer close(q)
	buf := make([]byte, maxFrame)
	for {
		n, _, err := from.conn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // ICMP port unreachable surfaces as a read error on Linux: not fatal
		}
		if r.cut.Load() {
			r.drop[dir].Add(1)
			continue
		}
		if sc := r.scan.Load(); sc != nil && bytes.Contains(buf[:n], sc.pattern) {
			sc.hits.Add(1)
		}
		f := frame{at: time.Now(), data: append([]byte(nil), buf[:n]...)}
		select {
		case q <- f:
		default:
			r.drop[dir].Add(1) // queue full: a congested link drops
		}
	}
}

type scan struct {
	pattern []byte
	hits    atomic.Int64
}

// Scan counts, from now on, the frames the relay reads in either direction (before any cut or
// delay decides their fate) whose bytes contain pattern, as a capture on the wire and a grep
// would; the returned function stops the scan and returns the count. One scan at a time: a
// second Scan replaces the first. A pattern shorter than a frame's payload and repeated in
// what is written is found in clear traffic whatever the segmentation.
func (r *Relay) Scan(pattern []byte) (stop func() int64) {
	sc := &scan{pattern: append([]byte(nil), pattern...)}
	r.scan.Store(sc)
	return func() int64 {
		r.scan.CompareAndSwap(sc, nil)
		return sc.hits.Load()
	}
}

// Cut drops every frame in both directions until Restore.
func (r *Relay) Cut() { r.cut.Store(true) }

// Restore forwards frames again after Cut.
func (r *Relay) Restore() { r.cut.Store(false) }

// IsCut reports whether the link is cut.
func (r *Relay) IsCut() bool { return r.cut.Load() }

// SetDelay holds each frame for d before forwarding it (0 forwards at once).
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Counts returns the frame counters. A frame the other side has received is always counted
// in Forwarded (the count is taken before the send); a frame whose send fails moves from
// Forwarded to Lost.
func (r *Relay) Counts() Counts {
	return Counts{ForwardedAB: r.fwd[0].Load(), ForwardedBA: r.fwd[1].Load(),
		DroppedAB: r.drop[0].Load(), DroppedBA: r.drop[1].Load(),
		LostAB: r.lost[0].Load(), LostBA: r.lost[1].Load()}
}

// Close stops forwarding and closes the sockets. Safe to call more than once.
func (r *Relay) Close() error {
	r.once.Do(func() {
		close(r.closed)
		for _, s := range []*Side{r.A, r.B} {
			if s != nil && s.conn != nil {
				s.conn.Close()
			}
		}
	})
	r.wg.Wait()
	return nil
}
