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
)

# peer_fields NAME: sets PEER_MOD, PEER_VAR, PEER_PKG, PEER_VER and PEER_PKGS (every main
# package of the line, PEER_PKG first) for NAME.
peer_fields() {
	local line
	for line in "${PEERS[@]}"; do
		set -- $line
		if [[ $1 == "$PEER_NAME" ]]; then
			PEER_MOD=$2 PEER_VAR=$3 PEER_PKG=$4 PEER_VER=${!3}
			shift 3
			PEER_PKGS=("$@")
			return 0
		fi
	done
	echo "unknown peer: $PEER_NAME (known: ${PEERS[*]%% *})" >&2
	return 1
}
