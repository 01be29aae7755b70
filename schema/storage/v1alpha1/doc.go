// Package v1alpha1 holds the runtime API (group storage.plinth.dev, version v1alpha1): the
// objects Plinth writes and its parts exchange through the API server — Agent (one per node that
// carries a pool), Store (one per pool and node) and VolumeState (one per volume). All kinds are
// cluster-scoped. This package imports only apimachinery, api, fluxcd/pkg/apis/meta and the
// policy API types, so the scheduler module can import it without CUE or controller-runtime.
//
// +kubebuilder:object:generate=true
// +groupName=storage.plinth.dev
package v1alpha1
