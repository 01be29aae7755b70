// Package nvmet exports block devices over NVMe-oF/TCP by writing the Linux
// kernel target's configfs tree (/sys/kernel/config/nvmet) directly: no
// nvmetcli, no shelling out.
//
// One volume is one subsystem (NQN derived from the volume id, see VolumeNQN)
// with one namespace (nsid 1) whose device_path is the LV or zvol. Ports are
// shared by every subsystem exported on the same (transport, address family,
// address, service id) and carry a stable id. Hosts are admitted either by
// attr_allow_any_host=1 or, with an ACL, by links from hosts/<hostnqn> into
// subsystems/<nqn>/allowed_hosts/.
//
// The kernel's rules that shape the order of every operation come from
// drivers/nvme/target/configfs.c:
//
//   - namespaces/<nsid>: nsid 0 and 0xffffffff are refused with EINVAL
//     (nvmet_ns_make);
//   - device_path, device_uuid and device_nguid writes while the namespace is
//     enabled fail with EBUSY; an empty device_path with EINVAL
//     (nvmet_ns_device_path_store, nvmet_ns_device_uuid_store,
//     nvmet_ns_device_nguid_store);
//   - revalidate_size on a disabled namespace fails with EINVAL
//     (nvmet_ns_revalidate_size_store);
//   - addr_* writes on a port that has at least one subsystem linked fail
//     with EACCES; the first link enables the port (the transport binds its
//     listener here, so a bad address surfaces as the link's error) and
//     removing the last link disables it (nvmet_port_subsys_allow_link,
//     nvmet_port_subsys_drop_link);
//   - linking the same subsystem into a port twice fails with EEXIST;
//   - linking an allowed host while attr_allow_any_host=1 fails with EINVAL,
//     a duplicate allowed host with EEXIST, and attr_allow_any_host=1 while
//     allowed hosts are linked with EINVAL (nvmet_allowed_hosts_allow_link,
//     nvmet_subsys_attr_allow_any_host_store);
//   - attr_serial is at most 20 printable ASCII bytes and is frozen (EINVAL)
//     once a host has identified the subsystem
//     (nvmet_subsys_attr_serial_store_locked);
//   - core.c keeps only the first 223 bytes of a subsystem NQN
//     (kstrndup(subsysnqn, NVMF_NQN_SIZE)), so NQNs are validated here
//     before any mkdir.
//
// Every configfs access goes through the FS interface so that unit tests can
// run the same code against a temporary directory whose test double enforces
// the rules above. Errors wrap the configfs path and the errno (errors.Is
// works with syscall.EBUSY, syscall.EACCES, ...).
package nvmet
