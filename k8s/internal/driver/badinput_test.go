// SPDX-License-Identifier: Apache-2.0

//go:build integration

package driver

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"nvtaskset.dev/k8s/internal/checkpoint"
)

const cfgHead = `"apiVersion":"tpc.nvtaskset.dev/v1alpha1","kind":"TpcConfig"`

// Every bad input fails its own claim with one line, leaves nothing of it
// behind (no holder, no spec, no checkpoint entry), and leaves the claims
// already prepared on the node as they were.
func TestBadInputs(t *testing.T) {
	n := newNode(t, 64)
	n.start()
	endpoint := n.register()
	a := newAllocator(t, n.slices(), deviceClass(t))
	held := []*resourceapi.ResourceClaim{newClaim("held-16", 16), newClaim("held-32", 32)}
	for _, c := range held {
		if !a.allocate(c, "pod-"+c.Name) {
			t.Fatal("not allocated")
		}
		if r := n.prepare(endpoint, c)[string(c.UID)]; r.Error != "" {
			t.Fatal(r.Error)
		}
	}
	// A pod that does not share the node's PID namespace.
	if _, err := n.client.CoreV1().Pods("default").Create(n.ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-lc", Namespace: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := n.status()
	ckpt := filepath.Join(n.dir, "state", "checkpoint.json")

	// allocated is an allocation of tpcs on gpu-0 as the allocator makes
	// it, then changed by edit (a stale or forged allocation).
	allocated := func(name string, tpcs int64, edit func(*resourceapi.ResourceClaim), cfg ...string) *resourceapi.ResourceClaim {
		c := newClaim(name, tpcs, cfg...)
		fresh := newAllocator(t, a.Slices, a.Classes[0])
		if !fresh.allocate(c, "pod-lc") {
			t.Fatalf("%s not allocated", name)
		}
		// The allocator copies the claim's configuration into the result.
		if edit != nil {
			edit(c)
		}
		return c
	}
	setTPCs := func(q string) func(*resourceapi.ResourceClaim) {
		return func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity[CapacityTPCs] = resource.MustParse(q)
		}
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"an invalid opaque config", allocated("bad-config", 8, nil, opaque(`{`+cfgHead+`,"tpcs":4}`)), `unknown field "tpcs"`},
		{"an unknown role", allocated("bad-role", 8, nil, opaque(`{`+cfgHead+`,"role":"realtime"}`)), `unknown role "realtime"`},
		{"an unknown mode", allocated("bad-mode", 8, nil, opaque(`{`+cfgHead+`,"mode":"scatter"}`)), `unknown mode "scatter"`},
		{"more than the free TPCs (a stale allocation)", allocated("too-big", 17, nil), "only 16 of 64 TPCs"},
		{"a GPU that disappeared", allocated("gone", 8, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].Device = "gpu-3"
		}), "gpu-3: no such GPU on this node"},
		{"no tpcs consumed (forged)", allocated("no-tpcs", 8, func(c *resourceapi.ResourceClaim) {
			delete(c.Status.Allocation.Devices.Results[0].ConsumedCapacity, CapacityTPCs)
		}), `consumes no "tpcs" capacity`},
		{"zero TPCs (forged)", allocated("zero", 8, setTPCs("0")), "0 TPCs allocated, the GPU has 1 to 64"},
		{"more TPCs than the GPU (forged)", allocated("huge", 8, setTPCs("65")), "65 TPCs allocated, the GPU has 1 to 64"},
		{"a fraction of a TPC (forged)", allocated("half", 8, setTPCs("500m")), "500m TPCs allocated"},
		{"another node's pool", allocated("foreign", 8, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].Pool = "node-2"
		}), `allocated from pool "node-2", not this node's`},
		{"admin access", allocated("admin", 8, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
		}), "admin access is not offered"},
		{"a role for a pod in its own PID namespace", allocated("lc", 8, nil, opaque(`{`+cfgHead+`,"role":"latency-critical"}`)),
			"role latency-critical needs the pod to share the node's PID namespace (hostPID: true), which pod default/pod-lc does not"},
		{"prepared again with another allocation", func() *resourceapi.ResourceClaim {
			c := newClaim("held-16", 16)
			c.Status = *held[0].Status.DeepCopy()
			setTPCs("8")(c)
			return c
		}(), "already prepared with another allocation (gpu-0, 16 TPCs)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := n.prepare(endpoint, tc.claim)[string(tc.claim.UID)]
			if r == nil || !strings.Contains(r.Error, tc.want) || len(r.Devices) != 0 {
				t.Fatalf("prepare: %+v; want the error %q", r, tc.want)
			}
			if strings.Contains(r.Error, "\n") || !strings.HasPrefix(r.Error, Name+": claim default/"+tc.claim.Name+": ") {
				t.Fatalf("not one line naming the claim: %q", r.Error)
			}
			if got := n.status(); !reflect.DeepEqual(got, before) {
				t.Fatalf("the node's partitions changed:\n%+v\nwant\n%+v", got, before)
			}
			if h := holders(n); len(h) != 2 {
				t.Fatalf("%d holders, want the 2 prepared claims'", len(h))
			}
			s, err := checkpoint.Load(ckpt)
			if err != nil || len(s.Claims) != 2 || (tc.claim.Name != "held-16" && s.Claims[string(tc.claim.UID)].Name != "") {
				t.Fatalf("checkpoint: %+v, %v", s.Claims, err)
			}
			if tc.claim.Name != "held-16" {
				if left, _ := filepath.Glob(filepath.Join(n.cdiDir, "*"+string(tc.claim.UID)+"*")); len(left) != 0 {
					t.Fatalf("a CDI spec was left for the failed claim: %v", left)
				}
			}
		})
	}
	// The claims prepared before still answer the same.
	for _, c := range held {
		if r := n.prepare(endpoint, c)[string(c.UID)]; r.Error != "" {
			t.Fatalf("%s after the bad inputs: %s", c.Name, r.Error)
		}
	}
}

// A role share for a pod that shares the node's PID namespace is claimed
// as the CLI's role (nvtaskset -n N --latency-critical), and its container
// gets the status directory the roles coordinate through.
func TestRoleShare(t *testing.T) {
	n := newNode(t, 64)
	n.start()
	endpoint := n.register()
	a := newAllocator(t, n.slices(), deviceClass(t))
	if _, err := n.client.CoreV1().Pods("default").Create(n.ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: "default"},
		Spec: v1.PodSpec{HostPID: true}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lc := newClaim("lc", 16, opaque(`{`+cfgHead+`,"role":"latency-critical","mode":"spread","partitionSmCount":true}`))
	if !a.allocate(lc, "server") {
		t.Fatal("not allocated")
	}
	r := n.prepare(endpoint, lc)[string(lc.UID)]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	row := holderTask(t, n.status(), "lc")
	if row.Role == nil || *row.Role != "latency-critical" || len(tpcs(t, row.TPCs)) != 16 {
		t.Fatalf("status row %+v", row)
	}
	spec := n.edits(r.Devices[0].CdiDeviceIds...)
	env := strings.Join(spec.Process.Env, "\n")
	for _, want := range []string{"NVTASKSET_ROLE=latency-critical", "NVTASKSET_SM_COUNT=partition", "NVTASKSET_STATUS_DIR=" + filepath.Join(n.dir, "status")} {
		if !strings.Contains(env, want) {
			t.Errorf("the container's environment lacks %s:\n%s", want, env)
		}
	}
	mounted := false
	for _, m := range spec.Mounts {
		mounted = mounted || m.Destination == filepath.Join(n.dir, "status")
	}
	if !mounted {
		t.Errorf("the status directory is not mounted: %+v", spec.Mounts)
	}
	// A second reservation that does not fit beside it is refused by the CLI.
	lc2 := newClaim("lc2", 49, opaque(`{`+cfgHead+`,"role":"latency-critical"}`))
	lc2.Status = *lc.Status.DeepCopy()
	lc2.Status.Allocation.Devices.Results[0].ConsumedCapacity[CapacityTPCs] = resource.MustParse("49")
	shareID := types.UID("share-lc2")
	lc2.Status.Allocation.Devices.Results[0].ShareID = &shareID
	if r := n.prepare(endpoint, lc2)[string(lc2.UID)]; r.Error == "" {
		t.Fatal("a reservation of 49 TPCs beside one of 16 on 64 was prepared")
	}
}
