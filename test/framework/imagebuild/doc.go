// Package imagebuild builds Plinth's container images without a Docker engine or a registry,
// reproducibly: the same commit gives byte-identical archives and the same manifest digests.
//
// A Tree is an in-memory file tree (files from Go binaries, from Debian packages read with
// dpkg-deb, and a few fixed files) that becomes one layer tar: entries sorted by path, one
// fixed modification time (SOURCE_DATE_EPOCH, the commit's time), owner root, no build paths.
// Build turns layers and a Spec into an image with go-containerregistry (empty, mutate,
// tarball), and WriteArchive writes it as one tar that is at once an OCI image layout
// (index.json names the image with io.containerd.image.name and
// org.opencontainers.image.ref.name, as `ctr images import` and `docker load` read it) and a
// docker-save archive (manifest.json, as older `docker load` and `crane push` read it). The
// archive is written under a temporary name and renamed when complete.
//
// Debian packages come from the machine's apt metadata: Resolve computes the dependency
// closure of the named packages (Depends and Pre-Depends, first satisfiable alternative),
// Fetch downloads them with `apt-get download` into a cache keyed by file name (which carries
// the version) and checks each file's SHA256 against the metadata.
package imagebuild
