// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// image builds a minimal container image with podman: the project's test
// program and the C and C++ runtime it and the shim need, nothing else.
// No registry is reachable from CI, so the image is made from a root
// file system here (podman import).
func image(t *testing.T, n *node) string {
	t.Helper()
	root := filepath.Join(n.dir, "rootfs")
	libs := map[string]bool{}
	for _, bin := range []string{n.launcher, filepath.Join(n.shimDir, "libcuda.so.1"), n.fakecuda} {
		out, err := exec.Command("ldd", bin).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", bin, err)
		}
		// "name => /path (0x...)" or "/path (0x...)": the path may hold spaces.
		for _, l := range strings.Split(string(out), "\n") {
			l = strings.TrimSpace(l)
			if _, after, ok := strings.Cut(l, "=> "); ok {
				l = after
			}
			if i := strings.LastIndex(l, " (0x"); i > 0 && strings.HasPrefix(l, "/") {
				libs[l[:i]] = true
			}
		}
	}
	for lib := range libs {
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			t.Fatal(err)
		}
		copyFile(t, real, filepath.Join(root, lib), 0o755)
	}
	for _, d := range []string{"tmp", "proc", "dev", "sys", "etc"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	copyFile(t, n.launcher, filepath.Join(root, "app", "launcher"), 0o755)
	tar := filepath.Join(n.dir, "rootfs.tar")
	if out, err := exec.Command("tar", "-C", root, "-cf", tar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	name := "localhost/nvtaskset-dra-test:" + filepath.Base(n.dir)
	if out, err := exec.Command("podman", "import", "--quiet", tar, name).CombinedOutput(); err != nil {
		t.Fatalf("podman import: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", name).Run() })
	return name
}

// podman runs /app/launcher in a container given the CDI devices, as a
// pod's container is started with the devices Prepare returned, and
// returns the TPCs its kernel ran on.
func podman(t *testing.T, n *node, img, user string, ids []string) []int {
	t.Helper()
	if err := os.WriteFile(n.record, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(n.record, 0o666)
	// runc, with the limits lowered to what this process may set (the
	// default ones raise RLIMIT_NOFILE/NPROC, which needs CAP_SYS_RESOURCE).
	args := []string{"run", "--rm", "--runtime", "runc", "--network", "none", "--ulimit", "nofile=1024:1024",
		"--ulimit", "nproc=1024:1024", "--user", user}
	for _, id := range ids {
		args = append(args, "--device", id)
	}
	args = append(args, img, "/app/launcher", "--kernels", "1", "--print-env", "NVTASKSET_PARTITION")
	cmd := exec.Command("podman", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	if !strings.Contains(out.String(), "env NVTASKSET_PARTITION=") || strings.Contains(out.String(), "NVTASKSET_PARTITION unset") {
		t.Fatalf("the container's process has no partition:\n%s", out.String())
	}
	return n.recorded(0)
}

// A real container runtime (podman with runc) starts containers with the
// CDI devices Prepare returned; their processes, as root and as another
// user, run on their shares' TPCs.
func TestPodmanRunsOnTheShare(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatalf("podman is needed (README's install command installs it): %v", err)
	}
	n := newNodeCDI(t, 64, true)
	n.start()
	endpoint := n.register()
	a := newAllocator(t, n.slices(), deviceClass(t))
	c16, c32 := newClaim("a", 16), newClaim("b", 32)
	if !a.allocate(c16, "pod-a") || !a.allocate(c32, "pod-b") {
		t.Fatal("not allocated")
	}
	resp := n.prepare(endpoint, c16, c32)
	img := image(t, n)
	st := n.status()
	for _, tc := range []struct {
		c    *resourceapi.ResourceClaim
		user string
	}{{c16, "0:0"}, {c32, "65534:65534"}} {
		r := resp[string(tc.c.UID)]
		if r.Error != "" {
			t.Fatal(r.Error)
		}
		want := tpcs(t, holderTask(t, st, tc.c.Name).TPCs)
		if got := podman(t, n, img, tc.user, r.Devices[0].CdiDeviceIds); !reflect.DeepEqual(got, want) {
			t.Fatalf("claim %s's container (user %s) ran on TPCs %v, want %v", tc.c.Name, tc.user, got, want)
		}
	}
}
