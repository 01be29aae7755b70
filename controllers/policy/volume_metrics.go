package policy

import (
	"context"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// LabelZone is the Node label whose value is a Store's failure domain in plinth_store_info
// (the well-known zone label kubelet or the cloud provider sets).
const LabelZone = corev1.LabelTopologyZone

// Descriptions of the series VolumeCollector exports. None has a per-volume label: each set is
// bounded by Stores × volume modes × phases (plinth_volumes), Stores (plinth_volume_size_bytes,
// plinth_store_info) or pairs of nodes that share NVMe-oF volumes (plinth_nvmeof_publications).
var (
	volumesDesc = prometheus.NewDesc("plinth_volumes",
		"VolumeStates by pool, Store, volume mode (Filesystem, Block) and phase (Pending, Creating, Ready, Expanding, Deleting, Failed).",
		[]string{"pool", "store", "mode", "phase"}, nil)
	volumeSizeDesc = prometheus.NewDesc("plinth_volume_size_bytes",
		"Sum of the real sizes (status.actualBytes) of the VolumeStates of a Store, by pool and volume mode, in bytes.",
		[]string{"pool", "store", "mode"}, nil)
	storeInfoDesc = prometheus.NewDesc("plinth_store_info",
		"1 for each Store, with its pool, node and the node's zone (topology.kubernetes.io/zone, empty when unset): joins Store series to failure domains.",
		[]string{"store", "pool", "node", "zone"}, nil)
	nvmeofPublicationsDesc = prometheus.NewDesc("plinth_nvmeof_publications",
		"NVMe-oF volumes a storage node (target_node) exports to a host node (host_node): the publications of VolumeStates with protocol nvmeofTcp.",
		[]string{"target_node", "host_node"}, nil)
)

// VolumeCollector exports plinth_volumes, plinth_volume_size_bytes, plinth_store_info and
// plinth_nvmeof_publications, computed at scrape time from the informer cache (Stores, Nodes,
// VolumeStates), so they are right after a controller restart without state of their own.
type VolumeCollector struct {
	Reader client.Reader
}

// Describe implements prometheus.Collector.
func (c *VolumeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- volumesDesc
	ch <- volumeSizeDesc
	ch <- storeInfoDesc
	ch <- nvmeofPublicationsDesc
}

// Collect implements prometheus.Collector.
func (c *VolumeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var stores storev1.StoreList
	var nodes corev1.NodeList
	var vols storev1.VolumeStateList
	for _, l := range []struct {
		list client.ObjectList
		desc *prometheus.Desc
	}{{&stores, storeInfoDesc}, {&nodes, storeInfoDesc}, {&vols, volumesDesc}} {
		if err := c.Reader.List(ctx, l.list); err != nil {
			ch <- prometheus.NewInvalidMetric(l.desc, err)
			return
		}
	}
	for _, s := range VolumeSeries(stores.Items, nodes.Items, vols.Items) {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, s.Value, s.Labels...)
	}
}

// Series is one gauge sample: the metric name, its label values in the order of the metric's
// labels, and the value.
type Series struct {
	Name   string
	Labels []string
	Value  float64
	desc   *prometheus.Desc
}

// VolumeSeries computes the samples of VolumeCollector from Stores, Nodes and VolumeStates, in
// a stable order (name, then labels). A VolumeState without a phase counts as Pending; its
// Store's node comes from the Store (the VolumeState's plinth.dev/node label when the Store is
// gone).
func VolumeSeries(stores []storev1.Store, nodes []corev1.Node, vols []storev1.VolumeState) []Series {
	zone := map[string]string{}
	for _, n := range nodes {
		zone[n.Name] = n.Labels[LabelZone]
	}
	storeNode := map[string]string{}
	var out []Series
	for _, s := range stores {
		storeNode[s.Name] = s.Spec.NodeName
		out = append(out, Series{Name: "plinth_store_info", desc: storeInfoDesc, Value: 1,
			Labels: []string{s.Name, s.Spec.Pool, s.Spec.NodeName, zone[s.Spec.NodeName]}})
	}
	type key struct{ a, b, c, d string }
	count, size, pubs := map[key]float64{}, map[key]float64{}, map[key]float64{}
	for i := range vols {
		v := &vols[i]
		phase := string(v.Status.Phase)
		if phase == "" {
			phase = string(storev1.VolumePending)
		}
		pool, store, mode := v.Spec.Policy.Pool, v.Spec.StoreName, v.Spec.VolumeMode
		count[key{pool, store, mode, phase}]++
		size[key{pool, store, mode, ""}] += float64(v.Status.ActualBytes)
		if v.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil {
			target := storeNode[store]
			if target == "" {
				target = v.Labels[policyv1.LabelNode]
			}
			for _, p := range v.Spec.Publications {
				pubs[key{target, p.NodeName, "", ""}]++
			}
		}
	}
	for k, n := range count {
		out = append(out, Series{Name: "plinth_volumes", desc: volumesDesc, Value: n, Labels: []string{k.a, k.b, k.c, k.d}})
	}
	for k, n := range size {
		out = append(out, Series{Name: "plinth_volume_size_bytes", desc: volumeSizeDesc, Value: n, Labels: []string{k.a, k.b, k.c}})
	}
	for k, n := range pubs {
		out = append(out, Series{Name: "plinth_nvmeof_publications", desc: nvmeofPublicationsDesc, Value: n, Labels: []string{k.a, k.b}})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		a, b := out[i].Labels, out[j].Labels
		for x := range a {
			if a[x] != b[x] {
				return a[x] < b[x]
			}
		}
		return false
	})
	return out
}
