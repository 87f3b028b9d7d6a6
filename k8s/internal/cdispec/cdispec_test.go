// SPDX-License-Identifier: Apache-2.0

package cdispec

import (
	"os"
	"reflect"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestContainerEnv(t *testing.T) {
	in := []string{"NVTASKSET_PARTITION=p", "NVTASKSET_PARTITION_PID=12", "LD_LIBRARY_PATH=/opt/nvtaskset/lib/nvtaskset",
		"LD_PRELOAD=/opt/nvtaskset/lib/nvtaskset/libcuda.so.1", "NVTASKSET_REAL_LIBCUDA=/usr/lib/libcuda.so.1",
		"ASAN_OPTIONS=verify_asan_link_order=0", "NVTASKSET_ROLE=best-effort", "CUDA_DEVICE_MAX_CONNECTIONS=8"}
	want := []string{"NVTASKSET_PARTITION=p", "LD_PRELOAD=/opt/nvtaskset/lib/nvtaskset/libcuda.so.1",
		"NVTASKSET_ROLE=best-effort", "CUDA_DEVICE_MAX_CONNECTIONS=8"}
	if got := ContainerEnv(in); !reflect.DeepEqual(got, want) {
		t.Fatalf("ContainerEnv = %q, want %q", got, want)
	}
}

func TestShimDir(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"A=1", "LD_PRELOAD=/x/lib/nvtaskset/libcuda.so.1:/other/lib.so"}, "/x/lib/nvtaskset"},
		// Preloaded by name: its directory holds a space.
		{[]string{"LD_LIBRARY_PATH=/x y/lib/nvtaskset:/usr/lib", "LD_PRELOAD=libcuda.so.1"}, "/x y/lib/nvtaskset"},
	} {
		if d, err := ShimDir(tc.env); err != nil || d != tc.want {
			t.Errorf("ShimDir(%q) = %q, %v; want %q", tc.env, d, err, tc.want)
		}
	}
	for _, env := range [][]string{{"A=1"}, {"LD_PRELOAD=libcuda.so.1"}, {"LD_PRELOAD=/x/other.so"},
		{"LD_LIBRARY_PATH=lib", "LD_PRELOAD=libcuda.so.1"}} {
		if d, err := ShimDir(env); err == nil {
			t.Errorf("ShimDir(%q) = %q, want an error", env, d)
		}
	}
}

// A written spec is valid to the CDI library, and injecting its device
// gives a container exactly its edits.
func TestWriteValidInject(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Build([]Device{{Name: "0f6c1d2e-share", Env: []string{"NVTASKSET_PARTITION=x", "LD_PRELOAD=/s/libcuda.so.1"},
		Mounts: []Mount{{Path: "/s", ReadOnly: true}, {Path: "/tmp/nvidia-mps"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write("claim-uid", spec); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("the CDI library finds errors: %v", errs)
	}
	oci := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}}
	if _, err := cache.InjectDevices(oci, QualifiedName("0f6c1d2e-share")); err != nil {
		t.Fatal(err)
	}
	env := strings.Join(oci.Process.Env, " ")
	if !strings.Contains(env, "NVTASKSET_PARTITION=x") || !strings.Contains(env, "LD_PRELOAD=/s/libcuda.so.1") {
		t.Fatalf("injected env %q", env)
	}
	var mounts []string
	for _, m := range oci.Mounts {
		mounts = append(mounts, m.Source+"->"+m.Destination+":"+strings.Join(m.Options, ","))
	}
	want := []string{"/s->/s:bind,nosuid,nodev,ro", "/tmp/nvidia-mps->/tmp/nvidia-mps:bind,nosuid,nodev,rw"}
	if !reflect.DeepEqual(mounts, want) {
		t.Fatalf("injected mounts %q, want %q", mounts, want)
	}
	if err := w.Remove("claim-uid"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(w.Path("claim-uid")); !os.IsNotExist(err) {
		t.Fatalf("spec still there after Remove: %v", err)
	}
	if err := w.Remove("claim-uid"); err != nil {
		t.Fatalf("a second Remove: %v", err)
	}
}

func TestBuildRefusesBadNames(t *testing.T) {
	if _, err := Build([]Device{{Name: "a/b"}}); err == nil {
		t.Fatal("Build accepted a device name with a slash")
	}
}
