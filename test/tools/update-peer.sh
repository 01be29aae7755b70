#!/usr/bin/env bash
# update-peer.sh PEER — (re)creates test/tools/PEER/go.mod for the version that
# versions.env names: a module of our own that requires the upstream sidecar as
# a `tool`, with the upstream go.mod's non-local replace directives copied (a
# dependency's replaces are not inherited; local ones such as `=> ./client` are
# dropped so the published module is used). Commit the resulting go.mod/go.sum.
# A peer of a group (peers.sh PEER_GROUPS), or the group's name, re-creates
# test/tools/<group>/go.mod for all its peers at once: every peer as a tool at its
# versions.env version, their replaces merged (newest first), the k8s.io ones at
# the k8s.io/client-go version the peers select together.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export GOFLAGS="${GOFLAGS:--buildvcs=false -trimpath}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
. "$HERE/versions.env"
. "$HERE/peers.sh"
PEER_NAME=${1:?usage: update-peer.sh PEER}
GROUP=$(group_of "$PEER_NAME")
if [[ -n $GROUP ]]; then
	D=$HERE/$GROUP
	rm -f "$D/go.mod" "$D/go.sum"; mkdir -p "$D"; cd "$D"
	go mod init "github.com/plinth-storage/plinth/test/tools/$GROUP" >/dev/null 2>&1
	group_members "$GROUP"
	# The members' versioned replaces, the newest version of each path first; a k8s.io
	# module among them then moves to the k8s.io/client-go version the members select
	# together (their go.mods name different patches).
	REPL=()
	for PEER_NAME in "${MEMBERS[@]}"; do
		peer_fields
		UPMOD=$(go mod download -json "$PEER_MOD@$PEER_VER" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
		[[ -n $UPMOD ]] || { echo "cannot download $PEER_MOD@$PEER_VER" >&2; exit 1; }
		mapfile -t -O "${#REPL[@]}" REPL < <(go mod edit -json "$UPMOD" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"].get("Version") and not r["Old"].get("Version"):
        print(r["Old"]["Path"], r["New"]["Path"], r["New"]["Version"])
')
	done
	mapfile -t REPL < <(printf '%s\n' "${REPL[@]}" | sort -k1,1 -k3,3Vr | sort -u -k1,1)
	replace_all() { # K8S_VERSION (empty: as the members name them)
		local line old new ver args=()
		for line in "${REPL[@]}"; do
			read -r old new ver <<<"$line"
			[[ -n $1 && $old == k8s.io/* ]] && ver=$1
			args+=("-replace=$old=$new@$ver")
		done
		((${#args[@]} == 0)) || go mod edit "${args[@]}"
	}
	replace_all ""
	for PEER_NAME in "${MEMBERS[@]}"; do
		peer_fields
		for pkg in "${PEER_PKGS[@]}"; do go get -tool "$pkg@$PEER_VER"; done
	done
	replace_all "$(go list -m -f '{{.Version}}' k8s.io/client-go)"
	go mod tidy
	echo "test/tools/$GROUP: ${MEMBERS[*]}; ${#REPL[@]} replace lines"
	exit 0
fi
peer_fields
D=$HERE/$PEER_NAME
rm -f "$D/go.mod" "$D/go.sum"; mkdir -p "$D"; cd "$D"
go mod init "github.com/plinth-storage/plinth/test/tools/$PEER_NAME" >/dev/null 2>&1
UPMOD=$(go mod download -json "$PEER_MOD@$PEER_VER" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -n $UPMOD ]] || { echo "cannot download $PEER_MOD@$PEER_VER" >&2; exit 1; }
mapfile -t REPL < <(go mod edit -json "$UPMOD" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    o, n = r["Old"], r["New"]
    if not n.get("Version"):
        continue  # local path replace: use the published module instead
    old = o["Path"] + ("@" + o["Version"] if o.get("Version") else "")
    print("-replace=%s=%s@%s" % (old, n["Path"], n["Version"]))
')
((${#REPL[@]})) && go mod edit "${REPL[@]}"
for pkg in "${PEER_PKGS[@]}"; do go get -tool "$pkg@$PEER_VER"; done
go mod tidy
echo "test/tools/$PEER_NAME: $PEER_MOD $PEER_VER, ${#REPL[@]} replace lines copied"
