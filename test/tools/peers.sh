# Sourced by build.sh and update-peer.sh: the CSI test peers, one Go module each
# under test/tools/<peer>/. Fields: peer name (= binary name), upstream module,
# versions.env variable, main package, then more main packages of the same module
# that build.sh builds in the same `go build` (binary name = last path element).
PEERS=(
	"csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 CSI_PROVISIONER_VERSION github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	"csi-attacher github.com/kubernetes-csi/external-attacher/v4 CSI_ATTACHER_VERSION github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	"csi-resizer github.com/kubernetes-csi/external-resizer/v2 CSI_RESIZER_VERSION github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
	"csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8 CSI_SNAPSHOTTER_VERSION github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
	"csi-sanity github.com/kubernetes-csi/csi-test/v5 CSI_SANITY_VERSION github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
	"flux-source-controller github.com/fluxcd/source-controller FLUX_SOURCE_CONTROLLER_VERSION github.com/fluxcd/source-controller"
	"flux-kustomize-controller github.com/fluxcd/kustomize-controller FLUX_KUSTOMIZE_CONTROLLER_VERSION github.com/fluxcd/kustomize-controller"
	"helm helm.sh/helm/v4 HELM_VERSION helm.sh/helm/v4/cmd/helm"
	"kustomize sigs.k8s.io/kustomize/kustomize/v5 KUSTOMIZE_VERSION sigs.k8s.io/kustomize/kustomize/v5"
)

# Groups: peers whose pins are a patch apart share ONE module under test/tools/<group>/ and
# one `go build`, so MVS over them at their versions.env versions compiles client-go, grpc and
# the rest once instead of once per peer (each peer keeps its own release; only shared
# dependencies move to the highest patch among them). The CSI sidecars pin client-go
# v0.37.0-v0.37.1, Flux's two controllers v0.36.2-v0.36.4 (and one controller-runtime).
PEER_GROUPS=(csi-sidecars flux-controllers)

# Version variables a peer's own Makefile sets with -X besides main.version (helm reports
# internal/version.version in `helm version`, and its default is only "v4.3" without it).
declare -A PEER_VERSION_VARS=(
	[helm]=helm.sh/helm/v4/internal/version.version
	[kustomize]=sigs.k8s.io/kustomize/api/provenance.version
)
GROUP_csi_sidecars=(csi-provisioner csi-attacher csi-resizer csi-snapshotter)
GROUP_flux_controllers=(flux-source-controller flux-kustomize-controller)

# group_of NAME: prints the group NAME belongs to (or NAME itself when it is a group), or
# nothing.
group_of() {
	local g m
	for g in "${PEER_GROUPS[@]}"; do
		[[ $1 == "$g" ]] && { echo "$g"; return 0; }
		local -n members="GROUP_${g//-/_}"
		for m in "${members[@]}"; do [[ $1 == "$m" ]] && { echo "$g"; return 0; }; done
	done
	return 0
}

# group_members GROUP: sets MEMBERS to the group's peers.
group_members() {
	local -n members="GROUP_${1//-/_}"
	MEMBERS=("${members[@]}")
}

# peer_fields NAME: sets PEER_MOD, PEER_VAR, PEER_PKG, PEER_VER, PEER_PKGS (every main
# package of the line, PEER_PKG first) and PEER_DIR (the peer's module under test/tools/) for
# NAME.
peer_fields() {
	local line
	for line in "${PEERS[@]}"; do
		set -- $line
		if [[ $1 == "$PEER_NAME" ]]; then
			PEER_MOD=$2 PEER_VAR=$3 PEER_PKG=$4 PEER_VER=${!3}
			PEER_DIR=$(group_of "$1")
			PEER_DIR=${PEER_DIR:-$1}
			shift 3
			PEER_PKGS=("$@")
			return 0
		fi
	done
	echo "unknown peer: $PEER_NAME (known: ${PEERS[*]%% *})" >&2
	return 1
}
