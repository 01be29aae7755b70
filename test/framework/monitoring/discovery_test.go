package monitoring

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

// Discovery answers with the targets and meta labels Prometheus' Kubernetes discovery would
// give, read from a real API server: an EndpointSlice of a labelled Service pointing at a pod
// (the ServiceMonitor's role), the pod's container ports, and a Node's kubelet.
func TestDiscoveryOnAPIServer(t *testing.T) {
	prereq.Env(t, prereq.EnvIntegration, "make test-integration sets it: this test runs a control plane")
	cp := controlplane.ForTest(t, controlplane.Options{})
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns = "plinth-system"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}}}
	if node, err = cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app.kubernetes.io/component": "agent"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-1", Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "agent", Image: "plinth",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9471}}}}}}
	if pod, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Status.PodIP, pod.Status.PodIPs = "10.244.1.5", []corev1.PodIP{{IP: "10.244.1.5"}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "plinth-agent-metrics", Namespace: ns,
		Labels: map[string]string{"plinth.dev/metrics": "true", "app.kubernetes.io/component": "agent"}},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: []corev1.ServicePort{{Name: "metrics", Port: 9471}}}}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The EndpointSlice controller does not run here (no controller manager): the slice it
	// would write.
	name, port, ready := "metrics", int32(9471), true
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "plinth-agent-metrics-x", Namespace: ns,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name}}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}}}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(Discovery{Client: cs})
	defer srv.Close()
	get := func(path string) []targetGroup {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		var out []targetGroup
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(what string, groups []targetGroup, target string, want map[string]string) {
		t.Helper()
		if len(groups) != 1 || len(groups[0].Targets) != 1 || groups[0].Targets[0] != target {
			t.Fatalf("%s: %+v, want one group with target %s", what, groups, target)
		}
		for k, v := range want {
			if got := groups[0].Labels[k]; got != v {
				t.Errorf("%s: %s = %q, want %q (labels %v)", what, k, got, v, groups[0].Labels)
			}
		}
	}
	check("endpointslice", get("/endpointslice?namespace="+ns), "10.244.1.5:9471", map[string]string{
		"__meta_kubernetes_namespace":                                 ns,
		"__meta_kubernetes_service_name":                              svc.Name,
		"__meta_kubernetes_service_label_plinth_dev_metrics":          "true",
		"__meta_kubernetes_service_labelpresent_plinth_dev_metrics":   "true",
		"__meta_kubernetes_service_label_app_kubernetes_io_component": "agent",
		"__meta_kubernetes_endpointslice_port_name":                   "metrics",
		"__meta_kubernetes_endpointslice_address_target_kind":         "Pod",
		"__meta_kubernetes_endpointslice_address_target_name":         pod.Name,
		"__meta_kubernetes_endpointslice_endpoint_conditions_ready":   "true",
		"__meta_kubernetes_pod_name":                                  pod.Name,
		"__meta_kubernetes_pod_node_name":                             "node-a",
		"__meta_kubernetes_pod_container_name":                        "agent",
	})
	check("pod", get("/pod?namespace="+ns), "10.244.1.5:9471", map[string]string{
		"__meta_kubernetes_pod_container_port_name":               "metrics",
		"__meta_kubernetes_pod_label_app_kubernetes_io_component": "agent",
	})
	check("node", get("/node"), "192.0.2.10:10250", map[string]string{
		"__meta_kubernetes_node_name":                              "node-a",
		"__meta_kubernetes_node_label_topology_kubernetes_io_zone": "zone-a",
	})
	if resp, err := http.Get(srv.URL + "/service"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown role: %v %v, want 404", resp, err)
	}
}
