package nvme

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzControllerAddress puts an arbitrary address attribute (sysfs, /sys/class/nvme/nvmeC/address)
// on a connected tcp controller and asks whether the node is connected to addr:port, and which
// address AuthControllers reports. Properties: no panic; connected exactly when the attribute's
// traddr field equals addr and its trsvcid field equals the port (whole fields: 10.0.0.10 is
// not 10.0.0.1); AuthControllers reports the traddr field.
func FuzzControllerAddress(f *testing.F) {
	f.Add("traddr=10.0.0.1,trsvcid=4420", "10.0.0.1", uint16(4420))
	f.Add("traddr=fd00::1,trsvcid=4420,src_addr=fd00::2", "fd00::1", uint16(4420))
	f.Add("traddr=10.0.0.1,trsvcid=4420,host_traddr=10.0.0.9,host_iface=eth0", "10.0.0.9", uint16(4420))
	f.Add("", "", uint16(0))
	f.Fuzz(func(t *testing.T, attr, addr string, port uint16) {
		k := newFakeKernel(t)
		k.connect(nqn, host, attr)
		in := k.initiator()
		// the model: the comma-separated key=value fields of the attribute as sysfs shows it
		fields := map[string]string{}
		for _, kv := range strings.Split(strings.TrimSpace(attr), ",") {
			key, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if _, seen := fields[key]; ok && !seen {
				fields[key] = v
			}
		}
		want := fields["traddr"] == addr && fields["trsvcid"] == strconv.Itoa(int(port))
		got, err := in.connected(Target{NQN: nqn, HostNQN: host, Address: addr, Port: int32(port)})
		if err != nil || got != want {
			t.Fatalf("connected to %q:%d with address %q = %v, %v; want %v", addr, port, attr, got, err, want)
		}
		k.write(k.sys+"/class/nvme/nvme0/dhchap_secret", "DHHC-1:00:x:")
		cs, err := in.AuthControllers(host)
		if err != nil || len(cs) != 1 || cs[0].Address != fields["traddr"] {
			t.Fatalf("AuthControllers with address %q = %+v, %v; want traddr %q", attr, cs, err, fields["traddr"])
		}
	})
}
