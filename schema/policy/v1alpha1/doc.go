// Package v1alpha1 holds the policy API (group policy.plinth.dev, version v1alpha1): the objects
// platform teams commit to Git and Flux or Argo CD sync into the cluster — StoragePool (where
// capacity lives), Protocol (how a volume reaches its consumer) and Placement (what apps see as a
// StorageClass). All kinds are cluster-scoped. The CUE schema in schema/cue mirrors these types
// field for field; schema/cue's agreement test fails when the two drift apart.
//
// +kubebuilder:object:generate=true
// +groupName=policy.plinth.dev
package v1alpha1
