//go:build tools

package plinth

import (
	_ "cuelang.org/go/cue"
	_ "github.com/container-storage-interface/spec/lib/go/csi"
	_ "github.com/fluxcd/pkg/apis/meta"
	_ "github.com/fluxcd/pkg/runtime/conditions"
	_ "github.com/fluxcd/pkg/ssa"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/spf13/cobra"
	_ "google.golang.org/grpc"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/mount-utils"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/kustomize/api/krusty"
	_ "sigs.k8s.io/yaml"
)
