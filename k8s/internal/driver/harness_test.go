// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"nvtaskset.dev/k8s/internal/holder"
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

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, os.ErrNotExist
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

// newClaim is a claim of the shipped class; tpcs 0 names no capacity.
func newClaim(name string, tpcs int64, configs ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	if tpcs > 0 {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			CapacityTPCs: *resource.NewQuantity(tpcs, resource.DecimalSI)}}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}, Config: configs}},
	}
}

// opaque is a claim's opaque configuration for this driver.
func opaque(raw string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: Name, Parameters: runtimeRaw(raw)}}}
}

// allocator allocates claims as the scheduler does: with the structured
// allocator, over the given slices, counting what earlier claims consume.
type allocator struct {
	t         *testing.T
	slices    []*resourceapi.ResourceSlice
	class     *resourceapi.DeviceClass
	allocated []*resourceapi.ResourceClaim
}

// allocate fills c.Status.Allocation and reserves it for pod; false when
// the claim cannot be allocated now.
func (a *allocator) allocate(c *resourceapi.ResourceClaim, pod string) bool {
	a.t.Helper()
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, done := range a.allocated {
		for _, r := range done.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	al, err := structured.NewAllocator(context.Background(), structured.Features{ConsumableCapacity: true}, state,
		classLister{a.class}, a.slices, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		a.t.Fatal(err)
	}
	res, err := al.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}, []*resourceapi.ResourceClaim{c})
	if err != nil {
		a.t.Fatalf("allocate %s: %v", c.Name, err)
	}
	if res == nil {
		return false
	}
	c.Status.Allocation = &res[0]
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID("pod-" + pod)}}
	a.allocated = append(a.allocated, c)
	return true
}

// release forgets an allocation (the claim was deleted).
func (a *allocator) release(c *resourceapi.ResourceClaim) {
	for i, x := range a.allocated {
		if x == c {
			a.allocated = append(a.allocated[:i], a.allocated[i+1:]...)
			return
		}
	}
}

func gpusOf(n, tpcs int) []nvtaskset.GPU {
	var out []nvtaskset.GPU
	for i := 0; i < n; i++ {
		out = append(out, nvtaskset.GPU{Index: i, Name: "Stand-in", UUID: "GPU-" + string(rune('a'+i)), ComputeCapability: "9.0",
			SMCount: 2 * tpcs, DriverVersion: 13000, DriverRelease: "580.95.05", TPCs: tpcs, GPCs: 8})
	}
	return out
}
