// containerd-stargz-grpc for the pull + start bench (bench/pull_start.py, client "stargz"):
// the stargz snapshotter as a containerd proxy plugin, so that an eStargz image is pulled
// lazily -- its layers are mounted over FUSE and each file's chunks are fetched from the
// registry when first read, the files the first `import torch` reads (the ones
// `ctr-remote images optimize` put first in each layer) prefetched in the background.
//
// Why this file exists: Debian 12 ships the snapshotter's library
// (golang-github-containerd-stargz-snapshotter-dev 0.12.0) and ctr-remote, but not the daemon
// (its upstream main reaches the Kubernetes CRI API, which Debian 12 does not package). This is
// the daemon without the CRI keychain: the registry hosts come from containerd's defaults
// (plain HTTP for localhost, HTTPS elsewhere), with no credentials -- enough for the bench's
// loopback registries, not a production snapshotter. Built by the bench with Debian's Go 1.19
// in GOPATH mode against the Debian packages (bench/lazy_pull.py).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/reference"
	"github.com/containerd/containerd/remotes/docker"
	stargzfs "github.com/containerd/stargz-snapshotter/fs"
	"github.com/containerd/stargz-snapshotter/fs/config"
	"github.com/containerd/stargz-snapshotter/fs/layer"
	"github.com/containerd/stargz-snapshotter/fs/source"
	snbase "github.com/containerd/stargz-snapshotter/snapshot"
	"google.golang.org/grpc"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "containerd-stargz-grpc:", err)
	os.Exit(1)
}

func main() {
	address := flag.String("address", "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock", "socket to serve on")
	root := flag.String("root", "/var/lib/containerd-stargz-grpc", "state directory")
	flag.Parse()
	ctx := context.Background()
	registries := docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost),
		// the fetcher round-trips through Client.Transport itself: it must not be nil
		docker.WithClient(&http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}))
	hosts := func(ref reference.Spec) ([]docker.RegistryHost, error) { return registries(ref.Hostname()) }
	fs, err := stargzfs.NewFilesystem(filepath.Join(*root, "stargz"), config.Config{},
		stargzfs.WithGetSources(source.FromDefaultLabels(hosts)),
		stargzfs.WithOverlayOpaqueType(layer.OverlayOpaqueTrusted))
	if err != nil {
		fail(err)
	}
	rs, err := snbase.NewSnapshotter(ctx, filepath.Join(*root, "snapshotter"), fs, snbase.AsynchronousRemove)
	if err != nil {
		fail(err)
	}
	if err := os.MkdirAll(filepath.Dir(*address), 0o700); err != nil {
		fail(err)
	}
	os.Remove(*address)
	l, err := net.Listen("unix", *address)
	if err != nil {
		fail(err)
	}
	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(rs))
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		rpc.Stop()
	}()
	if err := rpc.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	rs.Close()
}
