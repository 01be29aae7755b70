package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Discovery serves Prometheus HTTP service discovery (http_sd_configs) of a cluster's
// EndpointSlices, Nodes and Pods with the meta labels Prometheus' own Kubernetes discovery
// gives them (the subset KubernetesScrapeConfig relabels). Debian's Prometheus is built without
// Kubernetes discovery; this stands in for it, read from the API server at every refresh, so
// restarted pods are followed as kubernetes_sd_configs would follow them.
//
// Paths: /endpointslice?namespace=N, /pod?namespace=N, /node.
type Discovery struct {
	Client kubernetes.Interface
}

// targetGroup is one entry of the HTTP SD response.
type targetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// ServeHTTP answers one discovery request; errors of the API server are 502 with the error.
func (d Discovery) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ns := r.URL.Query().Get("namespace")
	var groups []targetGroup
	var err error
	switch r.URL.Path {
	case "/endpointslice":
		groups, err = d.endpointSlices(r.Context(), ns)
	case "/pod":
		groups, err = d.pods(r.Context(), ns)
	case "/node":
		groups, err = d.nodes(r.Context())
	default:
		http.Error(w, "unknown role "+r.URL.Path, http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if groups == nil {
		groups = []targetGroup{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(groups)
}

func addLabels(m map[string]string, prefix string, labels map[string]string) {
	for k, v := range labels {
		n := labelName(k)
		m[prefix+"label_"+n] = v
		m[prefix+"labelpresent_"+n] = "true"
	}
}

func podLabels(m map[string]string, p *corev1.Pod) {
	m["__meta_kubernetes_pod_name"] = p.Name
	m["__meta_kubernetes_pod_node_name"] = p.Spec.NodeName
	m["__meta_kubernetes_pod_ip"] = p.Status.PodIP
	addLabels(m, "__meta_kubernetes_pod_", p.Labels)
}

func (d Discovery) endpointSlices(ctx context.Context, ns string) ([]targetGroup, error) {
	slices, err := d.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices in %q: %w", ns, err)
	}
	pods, err := d.podIndex(ctx, ns)
	if err != nil {
		return nil, err
	}
	var out []targetGroup
	for _, s := range slices.Items {
		svcName := s.Labels[discoveryv1.LabelServiceName]
		var svc *corev1.Service
		if svcName != "" {
			if svc, err = d.Client.CoreV1().Services(s.Namespace).Get(ctx, svcName, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("Service %s/%s of EndpointSlice %s: %w", s.Namespace, svcName, s.Name, err)
			}
		}
		for _, ep := range s.Endpoints {
			for _, port := range s.Ports {
				if port.Port == nil {
					continue
				}
				for _, addr := range ep.Addresses {
					m := map[string]string{
						"__meta_kubernetes_namespace":                  s.Namespace,
						"__meta_kubernetes_endpointslice_name":         s.Name,
						"__meta_kubernetes_endpointslice_port":         strconv.Itoa(int(*port.Port)),
						"__meta_kubernetes_endpointslice_port_name":    deref(port.Name),
						"__meta_kubernetes_endpointslice_address_type": string(s.AddressType),
					}
					if ep.Conditions.Ready != nil {
						m["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] = strconv.FormatBool(*ep.Conditions.Ready)
					}
					if svc != nil {
						m["__meta_kubernetes_service_name"] = svc.Name
						addLabels(m, "__meta_kubernetes_service_", svc.Labels)
					}
					if ref := ep.TargetRef; ref != nil {
						m["__meta_kubernetes_endpointslice_address_target_kind"] = ref.Kind
						m["__meta_kubernetes_endpointslice_address_target_name"] = ref.Name
						if p := pods[ref.Name]; ref.Kind == "Pod" && p != nil {
							podLabels(m, p)
							for _, c := range p.Spec.Containers {
								for _, cp := range c.Ports {
									if cp.ContainerPort == *port.Port {
										m["__meta_kubernetes_pod_container_name"] = c.Name
										m["__meta_kubernetes_pod_container_port_name"] = cp.Name
									}
								}
							}
						}
					}
					out = append(out, targetGroup{Targets: []string{net.JoinHostPort(addr, strconv.Itoa(int(*port.Port)))}, Labels: m})
				}
			}
		}
	}
	return out, nil
}

func (d Discovery) podIndex(ctx context.Context, ns string) (map[string]*corev1.Pod, error) {
	list, err := d.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Pods in %q: %w", ns, err)
	}
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

func (d Discovery) pods(ctx context.Context, ns string) ([]targetGroup, error) {
	list, err := d.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Pods in %q: %w", ns, err)
	}
	var out []targetGroup
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.PodIP == "" {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				m := map[string]string{"__meta_kubernetes_namespace": p.Namespace,
					"__meta_kubernetes_pod_container_name":        c.Name,
					"__meta_kubernetes_pod_container_port_name":   cp.Name,
					"__meta_kubernetes_pod_container_port_number": strconv.Itoa(int(cp.ContainerPort)),
				}
				podLabels(m, p)
				out = append(out, targetGroup{Targets: []string{net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(cp.ContainerPort)))}, Labels: m})
			}
		}
	}
	return out, nil
}

func (d Discovery) nodes(ctx context.Context) ([]targetGroup, error) {
	list, err := d.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	var out []targetGroup
	for _, n := range list.Items {
		addr := ""
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				addr = a.Address
			}
		}
		if addr == "" {
			continue
		}
		m := map[string]string{"__meta_kubernetes_node_name": n.Name}
		addLabels(m, "__meta_kubernetes_node_", n.Labels)
		port := int(n.Status.DaemonEndpoints.KubeletEndpoint.Port)
		out = append(out, targetGroup{Targets: []string{net.JoinHostPort(addr, strconv.Itoa(port))}, Labels: m})
	}
	return out, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
