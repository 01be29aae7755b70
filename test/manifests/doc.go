// Package manifests checks the deployable manifests under kustomize/: every kustomization
// builds with sigs.k8s.io/kustomize/api (krusty), every built object is accepted by a
// server-side dry-run apply on the real kube-apiserver (test/framework/controlplane) with Plinth's CRDs
// and the third-party CRDs of crds/ installed, the ServiceAccounts can do exactly what their
// components need (access reviews, allowed and denied), the PrometheusRule passes
// `promtool check rules`, the dashboards are valid Grafana JSON, every metric name in alerts
// and dashboards is one the code registers, and the Argo CD Lua health checks map kstatus
// conditions to health.
package manifests
