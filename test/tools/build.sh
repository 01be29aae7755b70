#!/usr/bin/env bash
# build.sh [TARGET...] — builds the pinned test peers into bin/ (or $PLINTH_TESTBIN).
#
# Targets (default: all of them): kubernetes (kube-apiserver, kube-controller-manager,
# kubectl, kubelet, kube-proxy, etcd and plinth-scheduler in ONE `go build` from the scheduler/
# module, so they share compilation), csi-sidecars (csi-provisioner, csi-attacher,
# csi-resizer, csi-snapshotter and snapshot-controller in ONE go build from
# test/tools/csi-sidecars; any of those names builds the group), csi-sanity
# (test/tools/csi-sanity), flux-controllers (flux-source-controller and
# flux-kustomize-controller in one go build from test/tools/flux-controllers), flux-crds
# (their CRDs from the module cache into bin/crds/flux/), snapshot-crds (the
# snapshot.storage.k8s.io and groupsnapshot.storage.k8s.io CRDs into bin/crds/snapshot/), cue,
# helm (the helm CLI from test/tools/helm, for test/manifests' install/upgrade/uninstall of
# charts/plinth), kustomize (the kustomize CLI from test/tools/kustomize, which Argo CD's
# repo-server runs), argocd (Argo CD's
# multi-call binary from its own module source, and its CRDs into bin/crds/argocd/).
# Versions come from test/tools/versions.env only.
#
# Idempotent: each binary has a stamp in bin/.stamps/<name> (version, Go
# version, hash of its module's go.mod/go.sum and, for plinth-scheduler, of
# Plinth's own sources it compiles); a binary whose stamp matches is skipped.
# Also makes bin/assets (etcd, kube-apiserver, kubectl) for KUBEBUILDER_ASSETS.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${PLINTH_TESTBIN:-$ROOT/bin}
STAMPS=$BIN/.stamps
export GOFLAGS="${GOFLAGS:--buildvcs=false -trimpath}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# Static binaries, as upstream releases them: `make images` puts plinth-scheduler and the CSI
# sidecars into images that have no libc. The setting is part of every stamp, so binaries
# built with cgo before are rebuilt.
export CGO_ENABLED=0
. "$HERE/versions.env"
. "$HERE/peers.sh"
mkdir -p "$BIN" "$STAMPS" "$BIN/tools"

# Two builds at once (two shells running make testbin) would race on bin/.
exec 9>"$BIN/.build.lock"
flock 9

GOVER=$(go env GOVERSION)
SUMMARY=()
log() { printf '[testbin] %s\n' "$*"; }
hash_files() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }
stamp_ok() { # NAME KEY
	[[ -x $BIN/$1 && -f $STAMPS/$1 && "$(<"$STAMPS/$1")" == "$2" ]]
}
# check_pin DIR MODULE WANT: the module's go.mod must pin what versions.env says.
check_pin() {
	local got
	got=$(cd "$1" && go list -m -f '{{.Version}}' "$2")
	if [[ $got != "$3" ]]; then
		echo "[testbin] $1/go.mod pins $2 $got but versions.env says $3" >&2
		exit 1
	fi
}

build_kubernetes() {
	local mod=$ROOT/scheduler
	check_pin "$mod" k8s.io/kubernetes "$KUBERNETES_VERSION"
	check_pin "$mod" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
	local modhash srchash
	modhash=$(hash_files "$mod/go.mod" "$mod/go.sum")
	# plinth-scheduler compiles Plinth code: the scheduler module and schema/.
	srchash=$(find "$mod" "$ROOT/schema" -name '*.go' -not -path '*/testdata/*' 2>/dev/null | LC_ALL=C sort | xargs -r cat | sha256sum | cut -c1-16)
	# Version stamping as upstream's hack/lib/version.sh does, so --version and
	# /version report the pinned release instead of v0.0.0-master.
	local kv=$KUBERNETES_VERSION maj min ldflags="-s -w" p
	maj=${kv#v}; maj=${maj%%.*}; min=${kv#v*.}; min=${min%%.*}
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $p.gitVersion=$kv -X $p.gitMajor=$maj -X $p.gitMinor=$min -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
	done

	local ld
	ld=$(sha256sum <<<"$ldflags" | cut -c1-8)
	local -A pkg=(
		[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
		[kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
		[kubectl]=k8s.io/kubernetes/cmd/kubectl
		[kubelet]=k8s.io/kubernetes/cmd/kubelet
		[kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
		[etcd]=go.etcd.io/etcd/server/v3
		[plinth-scheduler]=./cmd/plinth-scheduler
	)
	local -A key=(
		[kube-apiserver]="kubernetes $KUBERNETES_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld"
		[kube-controller-manager]="kubernetes $KUBERNETES_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld"
		[kubectl]="kubernetes $KUBERNETES_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld"
		[kubelet]="kubernetes $KUBERNETES_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld"
		[kube-proxy]="kubernetes $KUBERNETES_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld"
		[etcd]="etcd $ETCD_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld"
		[plinth-scheduler]="kubernetes $KUBERNETES_VERSION $GOVER cgo=$CGO_ENABLED mod=$modhash ld=$ld src=$srchash"
	)
	local names=() pkgs=() n
	for n in kube-apiserver kube-controller-manager kubectl kubelet kube-proxy etcd plinth-scheduler; do
		if stamp_ok "$n" "${key[$n]}"; then
			SUMMARY+=("$(printf '%-24s %-10s up to date' "$n" "$(cut -d' ' -f2 <<<"${key[$n]}")")")
		else
			names+=("$n"); pkgs+=("${pkg[$n]}")
		fi
	done
	((${#names[@]})) || return 0

	log "building ${names[*]} (kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION) in one go build from scheduler/ ..."
	local tmp start secs
	tmp=$(mktemp -d "$BIN/.build.XXXXXX")
	start=$SECONDS
	if ! (cd "$mod" && go build -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"); then
		rm -rf "$tmp"; echo "[testbin] go build in scheduler/ failed" >&2; exit 1
	fi
	secs=$((SECONDS - start))
	[[ -f $tmp/server ]] && mv "$tmp/server" "$tmp/etcd" # main package go.etcd.io/etcd/server/v3
	for n in "${names[@]}"; do
		mv -f "$tmp/$n" "$BIN/$n"
		printf '%s\n' "${key[$n]}" >"$STAMPS/$n"
		SUMMARY+=("$(printf '%-24s %-10s built in %ds (one go build for: %s)' "$n" "$(cut -d' ' -f2 <<<"${key[$n]}")" "$secs" "${names[*]}")")
	done
	rm -rf "$tmp"
	log "kubernetes group done in ${secs}s"
}

build_peer() { # NAME
	local PEER_NAME=$1 PEER_MOD PEER_VAR PEER_PKG PEER_VER PEER_DIR
	local -a PEER_PKGS
	peer_fields
	local dir=$HERE/$PEER_DIR
	check_pin "$dir" "$PEER_MOD" "$PEER_VER"
	# Upstream's Makefiles stamp the version the same way (sidecars: main.version,
	# csi-sanity: main.VERSION); -X of a variable a binary lacks is ignored.
	local ldflags="-s -w -X main.version=$PEER_VER -X main.VERSION=$PEER_VER"
	[[ -z ${PEER_VERSION_VARS[$PEER_NAME]:-} ]] || ldflags+=" -X ${PEER_VERSION_VARS[$PEER_NAME]}=$PEER_VER"
	local k="$PEER_NAME $PEER_VER $GOVER cgo=$CGO_ENABLED mod=$(hash_files "$dir/go.mod" "$dir/go.sum") ld=$(sha256sum <<<"$ldflags" | cut -c1-8)"
	# Binary names: the peer's own, then the last path element of each further main package
	# of its line (csi-snapshotter's module also builds snapshot-controller).
	local -a bins=("$PEER_NAME") p
	for p in "${PEER_PKGS[@]:1}"; do bins+=("${p##*/}"); done
	local b fresh=1
	for b in "${bins[@]}"; do stamp_ok "$b" "$k" || fresh=0; done
	if ((fresh)); then
		SUMMARY+=("$(printf '%-24s %-10s up to date' "${bins[*]}" "$PEER_VER")")
		return 0
	fi
	log "building ${bins[*]} $PEER_VER from test/tools/$PEER_NAME (one go build) ..."
	local start=$SECONDS tmp
	tmp=$(mktemp -d "$BIN/.build.XXXXXX")
	if ! (cd "$dir" && go build -ldflags "$ldflags" -o "$tmp/" "${PEER_PKGS[@]}"); then
		rm -rf "$tmp"; echo "[testbin] go build of ${bins[*]} failed" >&2; exit 1
	fi
	# go build -o DIR/ names a binary after its package's last path element, or the one before
	# it when that is a major version suffix (sigs.k8s.io/kustomize/kustomize/v5 → kustomize).
	local first=${PEER_PKG##*/}
	[[ $first =~ ^v[0-9]+$ ]] && { first=${PEER_PKG%/*}; first=${first##*/}; }
	[[ $first == "$PEER_NAME" ]] || mv "$tmp/$first" "$tmp/$PEER_NAME"
	for b in "${bins[@]}"; do
		mv -f "$tmp/$b" "$BIN/$b"
		printf '%s\n' "$k" >"$STAMPS/$b"
	done
	rm -rf "$tmp"
	local secs=$((SECONDS - start))
	SUMMARY+=("$(printf '%-24s %-10s built in %ds' "${bins[*]}" "$PEER_VER" "$secs")")
	log "${bins[*]} done in ${secs}s"
}

# build_group GROUP: the peers of a group (peers.sh PEER_GROUPS) from their one module,
# test/tools/GROUP, in one go build; each binary is stamped with its own release (-ldflags per
# main package) and rebuilt when its stamp differs.
build_group() {
	local group=$1 dir=$HERE/$1 name PEER_NAME PEER_MOD PEER_VAR PEER_PKG PEER_VER PEER_DIR p b
	local -a PEER_PKGS MEMBERS pkgs=() flags=() bins=() vers=() keys=()
	local mod
	mod=$(hash_files "$dir/go.mod" "$dir/go.sum")
	group_members "$group"
	for name in "${MEMBERS[@]}"; do
		PEER_NAME=$name
		peer_fields
		check_pin "$dir" "$PEER_MOD" "$PEER_VER"
		# Upstream's Makefiles stamp the version the same way (main.version); -X of a
		# variable a binary lacks is ignored.
		local ldflags="-s -w -X main.version=$PEER_VER -X main.VERSION=$PEER_VER"
		for p in "${PEER_PKGS[@]}"; do
			pkgs+=("$p")
			flags+=("-ldflags=$p=$ldflags")
			b=${p##*/}
			[[ $p == "$PEER_PKG" ]] && b=$PEER_NAME
			bins+=("$b")
			vers+=("$PEER_VER")
			keys+=("$b $PEER_VER $GOVER cgo=$CGO_ENABLED mod=$mod ld=$(sha256sum <<<"$ldflags" | cut -c1-8)")
		done
	done
	local i fresh=1
	for i in "${!bins[@]}"; do stamp_ok "${bins[$i]}" "${keys[$i]}" || fresh=0; done
	if ((fresh)); then
		SUMMARY+=("$(printf '%-24s %-10s up to date' "${bins[*]}" "${vers[*]}")")
		return 0
	fi
	log "building ${bins[*]} from test/tools/$group (one go build) ..."
	local start=$SECONDS tmp
	tmp=$(mktemp -d "$BIN/.build.XXXXXX")
	if ! (cd "$dir" && go build "${flags[@]}" -o "$tmp/" "${pkgs[@]}"); then
		rm -rf "$tmp"; echo "[testbin] go build of ${bins[*]} failed" >&2; exit 1
	fi
	for i in "${!bins[@]}"; do
		# go build -o DIR/ names a binary after its package's last path element.
		p=${pkgs[$i]##*/}
		mv -f "$tmp/$p" "$BIN/${bins[$i]}"
		printf '%s\n' "${keys[$i]}" >"$STAMPS/${bins[$i]}"
	done
	rm -rf "$tmp"
	local secs=$((SECONDS - start))
	for i in "${!bins[@]}"; do
		SUMMARY+=("$(printf '%-24s %-10s built in %ds (one go build for: %s)' "${bins[$i]}" "${vers[$i]}" "$secs" "${bins[*]}")")
	done
	log "${bins[*]} done in ${secs}s"
}

build_cue() {
	local out=$BIN/tools/cue-$CUE_VERSION k="cue $CUE_VERSION $GOVER"
	if [[ -x $out && -f $STAMPS/cue && "$(<"$STAMPS/cue")" == "$k" ]] || [[ -x $out && ! -f $STAMPS/cue ]]; then
		# A cue-<version> from `make tools` is the same go install.
		printf '%s\n' "$k" >"$STAMPS/cue"
		SUMMARY+=("$(printf '%-24s %-10s up to date (bin/tools/cue-%s)' cue "$CUE_VERSION" "$CUE_VERSION")")
		return 0
	fi
	log "installing cue $CUE_VERSION ..."
	local start=$SECONDS tmp
	tmp=$(mktemp -d "$BIN/.build.XXXXXX")
	GOBIN=$tmp go install "cuelang.org/go/cmd/cue@$CUE_VERSION"
	mv -f "$tmp/cue" "$out"; rm -rf "$tmp"
	printf '%s\n' "$k" >"$STAMPS/cue"
	SUMMARY+=("$(printf '%-24s %-10s built in %ds (bin/tools/cue-%s)' cue "$CUE_VERSION" "$((SECONDS - start))" "$CUE_VERSION")")
}

# flux_crds: the CRDs of the pinned Flux controllers (every source.toolkit.fluxcd.io
# kind, and Kustomization), copied from their module zips in the Go module cache into
# bin/crds/flux/ (stamped like the binaries).
flux_crds() {
	# Every CRD of source-controller: it watches all its kinds and does not start without them.
	local out=$BIN/crds/flux k="flux-crds $FLUX_SOURCE_CONTROLLER_VERSION $FLUX_KUSTOMIZE_CONTROLLER_VERSION all-source-kinds"
	if [[ -f $STAMPS/flux-crds && "$(<"$STAMPS/flux-crds")" == "$k" && -d $out ]]; then
		return 0
	fi
	local sc kc
	sc=$(cd "$HERE/flux-controllers" && go mod download -json "github.com/fluxcd/source-controller@$FLUX_SOURCE_CONTROLLER_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	kc=$(cd "$HERE/flux-controllers" && go mod download -json "github.com/fluxcd/kustomize-controller@$FLUX_KUSTOMIZE_CONTROLLER_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	mkdir -p "$out"
	rm -f "$out"/*.yaml
	cp "$sc"/config/crd/bases/source.toolkit.fluxcd.io_*.yaml "$kc/config/crd/bases/kustomize.toolkit.fluxcd.io_kustomizations.yaml" "$out/"
	chmod 644 "$out"/*.yaml
	printf '%s\n' "$k" >"$STAMPS/flux-crds"
	SUMMARY+=("$(printf '%-24s %-10s copied from the module cache' flux-crds "$FLUX_SOURCE_CONTROLLER_VERSION/$FLUX_KUSTOMIZE_CONTROLLER_VERSION")")
}

# snapshot_crds: the CRDs of snapshot.storage.k8s.io (VolumeSnapshot, VolumeSnapshotContent,
# VolumeSnapshotClass) and of groupsnapshot.storage.k8s.io (VolumeGroupSnapshot and its content
# and class) that snapshot-controller and csi-snapshotter serve, copied from the
# external-snapshotter client/v8 module zip at the version test/tools/csi-sidecars' go.mod
# resolves into bin/crds/snapshot/.
snapshot_crds() {
	local mod=github.com/kubernetes-csi/external-snapshotter/client/v8 ver dir
	ver=$(cd "$HERE/csi-sidecars" && go list -m -f '{{.Version}}' "$mod")
	local out=$BIN/crds/snapshot k="snapshot-crds $ver with-groups"
	if [[ -f $STAMPS/snapshot-crds && "$(<"$STAMPS/snapshot-crds")" == "$k" && -d $out ]]; then
		SUMMARY+=("$(printf '%-24s %-10s up to date' snapshot-crds "$ver")")
		return 0
	fi
	dir=$(cd "$HERE/csi-sidecars" && go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	mkdir -p "$out"
	rm -f "$out"/*.yaml
	cp "$dir"/config/crd/snapshot.storage.k8s.io_*.yaml "$dir"/config/crd/groupsnapshot.storage.k8s.io_*.yaml "$out/"
	chmod 644 "$out"/*.yaml
	printf '%s\n' "$k" >"$STAMPS/snapshot-crds"
	SUMMARY+=("$(printf '%-24s %-10s copied from the module cache' snapshot-crds "$ver")")
}

# build_argocd: Argo CD's multi-call binary (application-controller, repo-server, ... chosen by
# argv[0] or ARGOCD_BINARY_NAME) at $ARGOCD_VERSION, and its CRDs (Application, AppProject) into
# bin/crds/argocd/. Argo CD's go.mod has a replace block (forks of k8s.io staging modules,
# gitops-engine) that only applies when it is the main module, so it cannot be a dependency of
# a module of ours like the Flux controllers: its module zip is copied out of the Go module
# cache (`go mod download -json` → Dir), made writable, and `go build ./cmd` runs inside the
# copy with its own go.mod. Stamped like the other peers (version, Go version, ldflags).
#
# Versions tried on Go 1.26.8 with this module proxy (2026-12):
#   v3.6.x, v3.5.8, v3.4.10: require the nested module github.com/argoproj/argo-cd/gitops-engine
#     through `replace => ./gitops-engine`, a directory the module zip leaves out; the proxy
#     answers 403 "not available" for its pseudo-version → cannot build.
#   v3.3.9: requires github.com/argoproj/gitops-engine with replace => ./gitops-engine: the same.
#   v3.2.12: its gitops-engine pseudo-version is served, but the release does not compile:
#     controller/cache/info.go:51: undefined: settings.ValidateExternalURL.
#   v3.2.9: builds (the pin): 2227 packages, on Kubernetes v0.34 modules that no other peer
#     shares. Measured on the loaded 2-core dev machine (load ~20, niced): 518 s for its first
#     build (only the standard library cached), 114 s with its packages cached (module copy +
#     link); the binary is ~150 MB (-s -w). Estimate for an empty GOCACHE on 2 idle CI cores:
#     10-12 min (the Flux pair, 1317 packages, is ~6-7 min).
build_argocd() {
	local mod=github.com/argoproj/argo-cd/v3 ver=$ARGOCD_VERSION
	local ldflags="-s -w -X $mod/common.version=${ver#v} -X $mod/common.gitTag=$ver -X $mod/common.gitTreeState=clean -X $mod/common.buildDate=2026-01-01T00:00:00Z"
	local k="argocd $ver $GOVER cgo=$CGO_ENABLED ld=$(sha256sum <<<"$ldflags" | cut -c1-8)"
	local crds=$BIN/crds/argocd
	if stamp_ok argocd "$k" && [[ -f $crds/application-crd.yaml && -f $crds/appproject-crd.yaml ]]; then
		SUMMARY+=("$(printf '%-24s %-10s up to date' argocd "$ver")")
		return 0
	fi
	log "building argocd $ver from its module source (go build ./cmd with its own go.mod) ..."
	local start=$SECONDS tmp dir
	tmp=$(mktemp -d "$BIN/.build.XXXXXX")
	# Outside any module of ours: `go mod download` of a version needs no go.mod.
	dir=$(cd "$tmp" && go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z $dir || ! -f $dir/go.mod ]]; then
		rm -rf "$tmp"; echo "[testbin] go mod download $mod@$ver failed" >&2; exit 1
	fi
	cp -r "$dir" "$tmp/src"
	chmod -R u+w "$tmp/src"
	if ! (cd "$tmp/src" && go build -ldflags "$ldflags" -o "$tmp/argocd" ./cmd); then
		rm -rf "$tmp"; echo "[testbin] go build of argocd $ver failed" >&2; exit 1
	fi
	mkdir -p "$crds"
	rm -f "$crds"/*.yaml
	cp "$tmp/src/manifests/crds/application-crd.yaml" "$tmp/src/manifests/crds/appproject-crd.yaml" "$crds/"
	chmod 644 "$crds"/*.yaml
	mv -f "$tmp/argocd" "$BIN/argocd"
	printf '%s\n' "$k" >"$STAMPS/argocd"
	rm -rf "$tmp"
	local secs=$((SECONDS - start))
	SUMMARY+=("$(printf '%-24s %-10s built in %ds' argocd "$ver" "$secs")")
	log "argocd done in ${secs}s"
}

make_assets() {
	mkdir -p "$BIN/assets"
	local n
	for n in etcd kube-apiserver kubectl; do
		[[ -x $BIN/$n ]] && ln -sfn "../$n" "$BIN/assets/$n"
	done
	return 0
}

TOTAL=$SECONDS
targets=("$@")
# Flux's two controllers are part of the default set: plinth-dev and test/e2e deliver the policy
# through them (one go build for the two; ~5 min of the cold build on 2 idle cores).
# csi-snapshotter and snapshot-controller (in the sidecars' go build) are too: the dev
# overlay deploys them. Measured on this
# loaded 2-core machine: from an empty GOCACHE, 357 CPU-seconds (264 user + 93 sys) had
# compiled about half of their 1317 packages (stopped there), so roughly 12 CPU-minutes cold,
# 6-7 min wall on 2 idle cores, less in CI where the other peers' packages are cached; with
# the packages cached, 30 CPU-seconds (the two links).
((${#targets[@]})) || targets=(kubernetes csi-sidecars csi-sanity snapshot-crds cue flux-controllers flux-crds helm kustomize argocd)
built_groups=()
for t in "${targets[@]}"; do
	case $t in
	kubernetes) build_kubernetes ;;
	cue) build_cue ;;
	flux-crds) flux_crds ;;
	snapshot-crds) snapshot_crds ;;
	argocd) build_argocd ;;
	*)
		g=$(group_of "$t")
		if [[ -n $g ]]; then
			# a group is built once, whichever of its names comes first
			[[ " ${built_groups[*]} " == *" $g "* ]] || build_group "$g"
			built_groups+=("$g")
		else
			build_peer "$t"
		fi
		;;
	esac
done
make_assets
log "summary ($BIN, ${GOVER}):"
printf '  %s\n' "${SUMMARY[@]}"
log "total $((SECONDS - TOTAL))s"
