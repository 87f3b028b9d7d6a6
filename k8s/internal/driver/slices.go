// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// DeviceName is the ResourceSlice device of GPU index i.
func DeviceName(i int) string { return "gpu-" + strconv.Itoa(i) }

// DefaultTPCs is what a claim that does not name `tpcs` consumes: 8 TPCs
// (16 SMs), one eighth of an H100's 66 (as one of Slurm's 8 shards), never
// the whole GPU silently; less on a GPU of fewer TPCs.
const DefaultTPCs = 8

// Resources is what the plugin publishes: one pool named after the node,
// one device per GPU, each with a consumable capacity `tpcs`.
func Resources(node string, gpus []nvtaskset.GPU, defaultTPCs int) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(gpus))
	for _, g := range gpus {
		devices = append(devices, Device(g, defaultTPCs))
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

// Device is one GPU as a device that many claims share (KEP-5075): each
// allocation consumes 1 to all of its TPCs.
func Device(g nvtaskset.GPU, defaultTPCs int) resourceapi.Device {
	def := min(defaultTPCs, g.TPCs)
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"uuid":        {StringValue: ptr.To(g.UUID)},
		"productName": {StringValue: ptr.To(g.Name)},
		"tpcCount":    {IntValue: ptr.To(int64(g.TPCs))},
		"gpcCount":    {IntValue: ptr.To(int64(g.GPCs))},
		"index":       {IntValue: ptr.To(int64(g.Index))},
	}
	if v := semver(g.ComputeCapability); v != "" {
		attrs["cudaComputeCapability"] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if v := semver(g.DriverRelease); v != "" {
		attrs["driverVersion"] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if g.DriverVersion > 0 {
		// The CUDA driver API version (13000 is CUDA 13.0).
		attrs["cudaDriverVersion"] = resourceapi.DeviceAttribute{VersionValue: ptr.To(
			fmt.Sprintf("%d.%d.0", g.DriverVersion/1000, g.DriverVersion%1000/10))}
	}
	if g.PCIBusID != "" {
		attrs["pciBusID"] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIBusID)}
	}
	return resourceapi.Device{
		Name:       DeviceName(g.Index),
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacityTPCs: {
				Value: *resource.NewQuantity(int64(g.TPCs), resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: resource.NewQuantity(int64(def), resource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(1, resource.DecimalSI),
						Max:  resource.NewQuantity(int64(g.TPCs), resource.DecimalSI),
						Step: resource.NewQuantity(1, resource.DecimalSI),
					},
				},
			},
		},
		AllowMultipleAllocations: ptr.To(true),
	}
}

// semver turns "9.0" or "580.95.05" into a semantic version ("9.0.0",
// "580.95.5"), or "" when it is not dotted numbers.
func semver(s string) string {
	parts := strings.Split(s, ".")
	if s == "" || len(parts) > 3 {
		return ""
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return ""
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(parts, ".")
}
