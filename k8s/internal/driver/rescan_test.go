// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"strings"
	"testing"
	"time"

	"nvtaskset.dev/k8s/internal/kubeletsim"
)

// The slices are published again when the node's GPUs change: a second
// GPU appears (the stand-in with FAKECUDA_DEVICES=2), then goes, and a
// claim allocated on it before it went fails Prepare in one line.
func TestRepublishesWhenTheGPUsChange(t *testing.T) {
	n := newNode(t, 64)
	n.start()
	endpoint := n.register()
	devicesPublished := func(want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			slices, err := kubeletsim.Slices(n.ctx, n.client)
			if err == nil && len(slices) == 1 && len(slices[0].Spec.Devices) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("want %d devices published, have %v (%v)", want, slices, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	devicesPublished(1)
	setDevices := func(count string) {
		t.Helper()
		n.d.opts.CLI.Env = append(n.nvtaskset().Env, "FAKECUDA_DEVICES="+count)
		if err := n.d.Rescan(n.ctx); err != nil {
			t.Fatal(err)
		}
	}
	setDevices("2")
	devicesPublished(2)
	a := newAllocator(t, n.slices(), deviceClass(t))
	a.Classes[0].Spec.Selectors[0].CEL.Expression = `device.driver == "tpc.nvtaskset.dev" && device.attributes["tpc.nvtaskset.dev"].index == 1`
	c := newClaim("on-gpu-1", 8)
	if !a.allocate(c, "pod-1") || c.Status.Allocation.Devices.Results[0].Device != "gpu-1" {
		t.Fatalf("not allocated on gpu-1: %+v", c.Status.Allocation)
	}
	setDevices("1")
	devicesPublished(1)
	if r := n.prepare(endpoint, c)[string(c.UID)]; r.Error == "" ||
		!strings.Contains(r.Error, "gpu-1: no such GPU on this node") {
		t.Fatalf("prepare on a GPU that went: %+v", r)
	}
}
