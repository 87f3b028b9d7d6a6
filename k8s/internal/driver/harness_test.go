// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/kubeletsim"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// TestMain lets the test binary be a holder too: the driver starts its
// holders from HolderExe, which in these tests is this binary.
func TestMain(m *testing.M) {
	if holder.IsHolder() {
		holder.Main()
	}
	os.Exit(m.Run())
}

const testNode = "node-1"

// deviceClass is the shipped DeviceClass (deploy/deviceclass.yaml).
func deviceClass(t *testing.T) *resourceapi.DeviceClass {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "deviceclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c resourceapi.DeviceClass
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// sliceObjects turns what the plugin publishes into ResourceSlice objects,
// as the resourceslice controller stores them.
func sliceObjects(res map[string][]resourceapi.Device) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for pool, devices := range res {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: pool + "-" + Name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   Name,
				Pool:     resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: 1},
				NodeName: ptr.To(pool),
				Devices:  devices,
			},
		})
	}
	return out
}

// newClaim is a claim of the shipped class; tpcs 0 names no capacity;
// each config is an opaque configuration's parameters (JSON).
func newClaim(name string, tpcs int64, configs ...string) *resourceapi.ResourceClaim {
	return kubeletsim.Claim("default", name, Name, tpcs, configs...)
}

// opaque is the parameters of an opaque configuration for this driver.
func opaque(raw string) string { return raw }

// allocator allocates claims as the scheduler does (kubeletsim.Scheduler).
type allocator struct {
	t *testing.T
	*kubeletsim.Scheduler
}

func newAllocator(t *testing.T, slices []*resourceapi.ResourceSlice, class *resourceapi.DeviceClass) *allocator {
	return &allocator{t, &kubeletsim.Scheduler{Node: testNode, Slices: slices, Classes: []*resourceapi.DeviceClass{class}}}
}

// allocate fills c.Status.Allocation and reserves it for pod; false when
// the claim cannot be allocated now.
func (a *allocator) allocate(c *resourceapi.ResourceClaim, pod string) bool {
	a.t.Helper()
	ok, err := a.Allocate(context.Background(), c, pod)
	if err != nil {
		a.t.Fatalf("allocate %s: %v", c.Name, err)
	}
	return ok
}

func gpusOf(n, tpcs int) []nvtaskset.GPU {
	var out []nvtaskset.GPU
	for i := 0; i < n; i++ {
		out = append(out, nvtaskset.GPU{Index: i, Name: "Stand-in", UUID: "GPU-" + string(rune('a'+i)), ComputeCapability: "9.0",
			SMCount: 2 * tpcs, DriverVersion: 13000, DriverRelease: "580.95.05", TPCs: tpcs, GPCs: 8})
	}
	return out
}
