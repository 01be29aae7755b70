// Command randio measures random I/O operations per second on a block device, in the guest:
// -jobs workers each issue one O_DIRECT pread or pwrite of -bs bytes at a random aligned offset
// of the first -span bytes, one after another, for -seconds. It prints one line:
//
//	randio rw=read bs=4096 jobs=4 seconds=10.00 ops=12345 iops=1234.5
//
// It stands in for fio (whose Debian package links Ceph, GlusterFS and RDMA libraries the guest
// initramfs would have to carry); the guestnode suite builds it with CGO_ENABLED=0 and ships it
// through the share like the plinth binary. Writes destroy the device's data: use them only on a
// volume that holds nothing.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	dev := flag.String("dev", "", "block device")
	rw := flag.String("rw", "read", "read or write")
	bs := flag.Int("bs", 4096, "bytes per operation (a multiple of 512)")
	span := flag.Int64("span", 64<<20, "bytes of the device the offsets fall in")
	jobs := flag.Int("jobs", 4, "concurrent workers (the queue depth)")
	secs := flag.Float64("seconds", 10, "duration in seconds")
	flag.Parse()
	if err := run(*dev, *rw, *bs, *span, *jobs, time.Duration(*secs*float64(time.Second))); err != nil {
		fmt.Fprintln(os.Stderr, "randio:", err)
		os.Exit(1)
	}
}

func run(dev, rw string, bs int, span int64, jobs int, d time.Duration) error {
	if dev == "" || bs <= 0 || bs%512 != 0 || span < int64(bs) || jobs <= 0 || (rw != "read" && rw != "write") {
		return fmt.Errorf("usage: -dev DEVICE [-rw read|write] [-bs N] [-span BYTES] [-jobs N] [-seconds S]")
	}
	flags := os.O_RDONLY
	if rw == "write" {
		flags = os.O_WRONLY
	}
	f, err := os.OpenFile(dev, flags|syscall.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	blocks := span / int64(bs)
	var ops atomic.Int64
	var firstErr error
	var once sync.Once
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for j := 0; j < jobs; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// O_DIRECT wants an aligned buffer: an anonymous mapping is page-aligned
			buf, err := syscall.Mmap(-1, 0, bs, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				once.Do(func() { firstErr = err })
				return
			}
			defer syscall.Munmap(buf) //nolint:errcheck
			r := rand.New(rand.NewPCG(uint64(j), uint64(start.UnixNano())))
			for time.Now().Before(deadline) {
				off := r.Int64N(blocks) * int64(bs)
				var err error
				if rw == "read" {
					_, err = f.ReadAt(buf, off)
				} else {
					binary.LittleEndian.PutUint64(buf, uint64(off))
					_, err = f.WriteAt(buf, off)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	el := time.Since(start).Seconds()
	fmt.Printf("randio rw=%s bs=%d jobs=%d seconds=%.2f ops=%d iops=%.1f\n", rw, bs, jobs, el, ops.Load(), float64(ops.Load())/el)
	return nil
}
