package netrelay

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"
)

// guestEnd stands in for one qemu socket netdev: it binds the side's guest port and sends to
// its relay port, as qemu does with udp=/localaddr=.
type guestEnd struct {
	c  *net.UDPConn
	to *net.UDPAddr
}

func bindSide(t *testing.T, s *Side) guestEnd {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: s.GuestPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return guestEnd{c, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: s.RelayPort}}
}

func (g guestEnd) send(t *testing.T, b []byte) {
	t.Helper()
	if _, err := g.c.WriteToUDP(b, g.to); err != nil {
		t.Fatal(err)
	}
}

// recv reads one frame, failing t when none arrives within 10 s (a bound on a hang, not a
// timing assertion).
func (g guestEnd) recv(t *testing.T) []byte {
	t.Helper()
	g.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, maxFrame)
	n, _, err := g.c.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("no frame: %v", err)
	}
	return buf[:n]
}

// waitCounts polls the counters until ok holds (bounded).
func waitCounts(t *testing.T, r *Relay, what string, ok func(Counts) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(r.Counts()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: counts %+v", what, r.Counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRelayForwardCutRestoreDelay(t *testing.T) {
	r, err := Start("52:54:00:77:00:01", "52:54:00:77:00:02")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a, b := bindSide(t, r.A), bindSide(t, r.B)

	a.send(t, []byte("frame-ab"))
	if got := b.recv(t); string(got) != "frame-ab" {
		t.Errorf("B got %q", got)
	}
	b.send(t, []byte("frame-ba"))
	if got := a.recv(t); string(got) != "frame-ba" {
		t.Errorf("A got %q", got)
	}

	r.Cut()
	for i := 0; i < 3; i++ {
		a.send(t, []byte("lost"))
		b.send(t, []byte("lost"))
	}
	waitCounts(t, r, "3 frames dropped each way", func(c Counts) bool { return c.DroppedAB == 3 && c.DroppedBA == 3 })
	r.Restore()
	a.send(t, []byte("after"))
	if got := b.recv(t); string(got) != "after" {
		t.Errorf("after restore B got %q (a dropped frame came through?)", got)
	}

	// delayed frames arrive complete and in order
	r.SetDelay(20 * time.Millisecond)
	for i := 0; i < 5; i++ {
		a.send(t, []byte(fmt.Sprintf("d%d", i)))
	}
	for i := 0; i < 5; i++ {
		if got := b.recv(t); !bytes.Equal(got, []byte(fmt.Sprintf("d%d", i))) {
			t.Errorf("delayed frame %d: %q", i, got)
		}
	}
	c := r.Counts()
	// read right after the last receive: a delivered frame is already counted
	if c.ForwardedAB != 7 || c.ForwardedBA != 1 || c.LostAB+c.LostBA != 0 {
		t.Errorf("forwarded %+v, want 7 A→B and 1 B→A", c)
	}
}

func TestNetdevArgs(t *testing.T) {
	s := &Side{GuestPort: 4001, RelayPort: 4002, MAC: "52:54:00:77:00:01"}
	got := fmt.Sprint(s.NetdevArgs("p0"))
	want := "[-netdev socket,id=p0,udp=127.0.0.1:4002,localaddr=127.0.0.1:4001 -device virtio-net-pci,netdev=p0,mac=52:54:00:77:00:01]"
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	if _, err := Start("not-a-mac", "52:54:00:77:00:02"); err == nil {
		t.Error("Start with a bad MAC succeeded")
	}
}

// Scan counts the frames, in either direction, that hold the pattern somewhere in their bytes,
// and only while it runs.
func TestRelayScan(t *testing.T) {
	r, err := Start("52:54:00:00:00:01", "52:54:00:00:00:02")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a, b := bindSide(t, r.A), bindSide(t, r.B)
	pattern := []byte("PLINTH-PLAINTEXT-0123")
	stop := r.Scan(pattern)
	frames := [][]byte{
		append(append([]byte("header-bytes "), pattern...), " trailer"...), // A→B, holds it
		[]byte("PLINTH-PLAIN" + "TEXT-012"),                                // B→A, one byte short
		append([]byte("xx"), pattern...),                                   // B→A, holds it
	}
	a.send(t, frames[0])
	b.recv(t)
	for _, f := range frames[1:] {
		b.send(t, f)
		a.recv(t)
	}
	if n := stop(); n != 2 {
		t.Errorf("Scan counted %d frames, want 2", n)
	}
	a.send(t, frames[0]) // after stop: not counted
	b.recv(t)
	if n := stop(); n != 2 {
		t.Errorf("after stop: %d frames, want still 2", n)
	}
}
