#!/usr/bin/env bash
# update-peer.sh PEER — (re)creates test/tools/PEER/go.mod for the version that
# versions.env names: a module of our own that requires the upstream sidecar as
# a `tool`, with the upstream go.mod's non-local replace directives copied (a
# dependency's replaces are not inherited; local ones such as `=> ./client` are
# dropped so the published module is used). Commit the resulting go.mod/go.sum.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export GOFLAGS="${GOFLAGS:--buildvcs=false -trimpath}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
. "$HERE/versions.env"
. "$HERE/peers.sh"
PEER_NAME=${1:?usage: update-peer.sh PEER}
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
