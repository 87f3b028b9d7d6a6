// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// The scheduler's own allocator, over the slices the plugin publishes:
// shares of the `tpcs` capacity until the GPU is full, the default for a
// claim that names none, and nothing beyond the GPU.
func TestAllocatorOverPublishedSlices(t *testing.T) {
	res := Resources(testNode, gpusOf(1, 64), DefaultTPCs)
	a := newAllocator(t, sliceObjects(map[string][]resourceapi.Device{testNode: res.Pools[testNode].Slices[0].Devices}), deviceClass(t))
	consumed := func(c *resourceapi.ResourceClaim) int64 {
		r := c.Status.Allocation.Devices.Results[0]
		if r.Driver != Name || r.Pool != testNode || r.Device != "gpu-0" || r.ShareID == nil {
			t.Fatalf("%s: allocated %+v", c.Name, r)
		}
		q := r.ConsumedCapacity[CapacityTPCs]
		return q.Value()
	}
	c16, c32, cdef := newClaim("a", 16), newClaim("b", 32), newClaim("c", 0)
	for _, tc := range []struct {
		c    *resourceapi.ResourceClaim
		want int64
	}{{c16, 16}, {c32, 32}, {cdef, DefaultTPCs}} {
		if !a.allocate(tc.c, tc.c.Name) {
			t.Fatalf("%s not allocated", tc.c.Name)
		}
		if got := consumed(tc.c); got != tc.want {
			t.Fatalf("%s consumes %d TPCs, want %d", tc.c.Name, got, tc.want)
		}
	}
	if *c16.Status.Allocation.Devices.Results[0].ShareID == *c32.Status.Allocation.Devices.Results[0].ShareID {
		t.Fatal("two allocations of one device share a ShareID")
	}
	// 56 of 64 are taken: 9 do not fit, 8 do.
	if c := newClaim("d", 9); a.allocate(c, "d") {
		t.Fatalf("9 TPCs allocated with 8 free: %+v", c.Status.Allocation)
	}
	if c := newClaim("e", 8); !a.allocate(c, "e") {
		t.Fatal("8 TPCs not allocated with 8 free")
	}
	// Past the GPU, or below one TPC, never.
	for _, n := range []int64{65} {
		b := newAllocator(t, a.Slices, a.Classes[0])
		if c := newClaim("big", n); b.allocate(c, "big") {
			t.Fatalf("%d TPCs allocated on a GPU of 64", n)
		}
	}
}

// The shipped example's claim template allocates 16 TPCs.
func TestExampleClaimTemplate(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tmpl resourceapi.ResourceClaimTemplate
	docs := splitYAML(b)
	if err := yaml.Unmarshal(docs[0], &tmpl); err != nil || tmpl.Kind != "ResourceClaimTemplate" {
		t.Fatalf("example.yaml's first document: %v (%s)", err, tmpl.Kind)
	}
	res := Resources(testNode, gpusOf(1, 66), DefaultTPCs)
	a := newAllocator(t, sliceObjects(map[string][]resourceapi.Device{testNode: res.Pools[testNode].Slices[0].Devices}), deviceClass(t))
	c := newClaim("example", 0)
	c.Spec = tmpl.Spec.Spec
	// The API server's defaults for a request that names no mode.
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly.AllocationMode == "" {
			r.Exactly.AllocationMode, r.Exactly.Count = resourceapi.DeviceAllocationModeExactCount, 1
		}
	}
	if !a.allocate(c, "inference") {
		t.Fatal("the example's claim was not allocated")
	}
	q := c.Status.Allocation.Devices.Results[0].ConsumedCapacity[CapacityTPCs]
	if q.Value() != 16 {
		t.Fatalf("the example's claim consumes %s TPCs, want 16", q.String())
	}
}

func splitYAML(b []byte) [][]byte {
	var out [][]byte
	for _, d := range strings.Split(string(b), "\n---\n") {
		out = append(out, []byte(d))
	}
	return out
}
