// SPDX-License-Identifier: Apache-2.0

package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"nvtaskset.dev/k8s/internal/cdispec"
	"nvtaskset.dev/k8s/internal/checkpoint"
	"nvtaskset.dev/k8s/internal/config"
	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// PrepareResourceClaims prepares each claim on its own: one claim's
// failure leaves the others as they are.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devices, err := d.prepare(ctx, c)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(c))
			// One line, which the kubelet puts into the pod's events.
			err = fmt.Errorf("%s: claim %s/%s: %s", Name, c.Namespace, c.Name, oneLine(err.Error()))
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return out, nil
}

// UnprepareResourceClaims releases each claim's TPCs and removes its spec.
// A claim this plugin does not hold is already unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepare(ctx, string(c.UID))
	}
	return out, nil
}

func (d *Driver) unprepare(ctx context.Context, uid string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.state.Claims[uid]
	if ok {
		if err := d.release(c); err != nil {
			return err
		}
		delete(d.state.Claims, uid)
		if err := checkpoint.Save(d.ckpt, d.state); err != nil {
			return err
		}
		klog.FromContext(ctx).V(2).Info("Released", "claim", klog.KRef(c.Namespace, c.Name))
	}
	return d.cdi.Remove(uid)
}

// want is one allocated share as the allocation asks for it.
type want struct {
	result resourceapi.DeviceRequestAllocationResult
	gpu    nvtaskset.GPU
	tpcs   int
	cfg    config.Config
	name   string // its CDI device name
}

// Same says whether a prepared share is what w asks for.
func (w want) same(s checkpoint.Share) bool {
	return s.Request == w.result.Request && s.Pool == w.result.Pool && s.Device == w.result.Device &&
		s.ShareID == shareID(w.result) && s.GPU == w.gpu.UUID && s.TPCs == w.tpcs && s.Role == string(w.cfg.Role) &&
		s.Spread == (w.cfg.Mode == config.Spread) && s.SMCount == w.cfg.PartitionSMCount
}

func shareID(r resourceapi.DeviceRequestAllocationResult) string {
	if r.ShareID == nil {
		return ""
	}
	return string(*r.ShareID)
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, errors.New("not allocated")
	}
	wants, err := d.wants(ctx, c)
	if err != nil || len(wants) == 0 {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	uid := string(c.UID)
	if prev, ok := d.state.Claims[uid]; ok && prev.Prepared {
		// The kubelet asks again (it restarted, or a second pod shares
		// the claim): the same answer, from what is held.
		return d.again(prev, uid, wants)
	}
	entry := checkpoint.Claim{Namespace: c.Namespace, Name: c.Name, Pod: consumers(c)}
	// Each holder is on disk, in an entry marked not prepared, before its
	// claim is made; a plugin that dies half-way leaves holders that its
	// successor stops (listed or not: holder.Running), never a claim.
	d.state.Claims[uid] = entry
	fail := func(err error) ([]kubeletplugin.Device, error) {
		_ = d.release(d.state.Claims[uid])
		delete(d.state.Claims, uid)
		if serr := checkpoint.Save(d.ckpt, d.state); serr != nil {
			err = errors.Join(err, serr)
		}
		_ = d.cdi.Remove(uid)
		return nil, err
	}
	for _, w := range wants {
		p, err := holder.Start(d.opts.HolderExe, label(entry), d.owner)
		if err != nil {
			return fail(err)
		}
		s := checkpoint.Share{
			Request: w.result.Request, Pool: w.result.Pool, Device: w.result.Device, ShareID: shareID(w.result),
			GPU: w.gpu.UUID, TPCs: w.tpcs, Role: string(w.cfg.Role), Holder: p, CDIName: w.name,
			Spread: w.cfg.Mode == config.Spread, SMCount: w.cfg.PartitionSMCount,
		}
		entry.Shares = append(entry.Shares, s)
		d.state.Claims[uid] = entry
		if err := checkpoint.Save(d.ckpt, d.state); err != nil {
			return fail(err)
		}
		got, err := d.opts.CLI.Claim(ctx, d.share(&s, p.PID))
		if err != nil {
			return fail(fmt.Errorf("%s: %w", w.result.Device, err))
		}
		// The TPCs chosen, so that a share whose holder dies can be
		// claimed again exactly.
		entry.Shares[len(entry.Shares)-1].Env, entry.Shares[len(entry.Shares)-1].List = got.Env, got.TPCs
	}
	devices, err := d.writeSpec(uid, entry.Shares)
	if err != nil {
		return fail(err)
	}
	entry.Prepared = true
	d.state.Claims[uid] = entry
	if err := checkpoint.Save(d.ckpt, d.state); err != nil {
		return fail(err)
	}
	return devices, nil
}

// again answers a repeated Prepare of a prepared claim: the same devices,
// if the allocation is the one prepared and every share is still held.
func (d *Driver) again(prev checkpoint.Claim, uid string, wants []want) ([]kubeletplugin.Device, error) {
	if len(prev.Shares) != len(wants) {
		return nil, fmt.Errorf("already prepared with %d shares, the allocation now has %d", len(prev.Shares), len(wants))
	}
	for i, w := range wants {
		if !w.same(prev.Shares[i]) {
			return nil, fmt.Errorf("already prepared with another allocation (%s, %d TPCs); unprepare it first", prev.Shares[i].Device, prev.Shares[i].TPCs)
		}
		if !prev.Shares[i].Holder.Alive() {
			return nil, fmt.Errorf("%s: the share's holder is gone and it could not be claimed again on TPCs %s", w.result.Device, prev.Shares[i].List)
		}
	}
	return d.writeSpec(uid, prev.Shares)
}

// wants reads the allocation's shares of this driver and checks each
// against the node: its pool, its GPU, its TPC count and its options.
func (d *Driver) wants(ctx context.Context, c *resourceapi.ResourceClaim) ([]want, error) {
	alloc := c.Status.Allocation.Devices
	cfgs, err := configs(alloc.Config)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	gpus := d.gpus
	d.mu.Unlock()
	var out []want
	for i, r := range alloc.Results {
		if r.Driver != Name {
			continue
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return nil, fmt.Errorf("%s: admin access is not offered: every share is fenced", r.Device)
		}
		if r.Pool != d.opts.NodeName {
			return nil, fmt.Errorf("%s: allocated from pool %q, not this node's (%q)", r.Device, r.Pool, d.opts.NodeName)
		}
		g, ok := gpus[r.Device]
		if !ok {
			return nil, fmt.Errorf("%s: no such GPU on this node (gone since the allocation?)", r.Device)
		}
		q, ok := r.ConsumedCapacity[CapacityTPCs]
		if !ok {
			return nil, fmt.Errorf("%s: the allocation consumes no %q capacity", r.Device, CapacityTPCs)
		}
		n, exact := q.AsInt64()
		if !exact || n < 1 || n > int64(g.TPCs) {
			return nil, fmt.Errorf("%s: %s TPCs allocated, the GPU has 1 to %d", r.Device, q.String(), g.TPCs)
		}
		cfg := cfgs.For(r.Request)
		if cfg.Role != nvtaskset.RoleNone {
			if err := d.rolePods(ctx, c, cfg.Role); err != nil {
				return nil, err
			}
		}
		name := string(c.UID) + "-" + strconv.Itoa(i)
		if r.ShareID != nil {
			name = string(*r.ShareID)
		}
		out = append(out, want{result: r, gpu: g, tpcs: int(n), cfg: cfg, name: name})
	}
	return out, nil
}

// rolePods: the roles coordinate through nvtaskset's status entries and
// beacons, which name processes by their PID on the node and are checked
// against /proc; a pod in a PID namespace of its own can neither see
// them nor be seen, and a latency-critical task there would burst onto
// other pods' TPCs. So a role share's pods must share the node's PID
// namespace.
func (d *Driver) rolePods(ctx context.Context, c *resourceapi.ResourceClaim, role nvtaskset.Role) error {
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource != "pods" || ref.APIGroup != "" {
			continue
		}
		if d.opts.Client == nil {
			return fmt.Errorf("role %s: cannot read pod %s/%s", role, c.Namespace, ref.Name)
		}
		pod, err := d.opts.Client.CoreV1().Pods(c.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("role %s: pod %s/%s: %v", role, c.Namespace, ref.Name, err)
		}
		if !pod.Spec.HostPID {
			return fmt.Errorf("role %s needs the pod to share the node's PID namespace (hostPID: true), which pod %s/%s does not", role, c.Namespace, ref.Name)
		}
	}
	return nil
}

// share is the CLI's request for a prepared share, held by pid.
func (d *Driver) share(s *checkpoint.Share, pid int) nvtaskset.Share {
	return nvtaskset.Share{
		Holder: pid, GPU: s.GPU, TPCs: s.TPCs, Spread: s.Spread, Role: nvtaskset.Role(s.Role),
		PartitionSMCount: s.SMCount, MPS: d.opts.MPS,
	}
}

// writeSpec writes the claim's CDI spec and returns its devices. d.mu is
// held.
func (d *Driver) writeSpec(uid string, shares []checkpoint.Share) ([]kubeletplugin.Device, error) {
	var cdevs []cdispec.Device
	var out []kubeletplugin.Device
	for _, s := range shares {
		shim, err := cdispec.ShimDir(s.Env)
		if err != nil {
			return nil, err
		}
		cd := cdispec.Device{Name: s.CDIName, Env: cdispec.ContainerEnv(s.Env), Mounts: []cdispec.Mount{{Path: shim, ReadOnly: true}}}
		if d.opts.MPS == nvtaskset.MPSMultiUser {
			cd.Env = append(cd.Env, "CUDA_MPS_PIPE_DIRECTORY="+d.opts.MPSPipeDir)
			cd.Mounts = append(cd.Mounts, cdispec.Mount{Path: d.opts.MPSPipeDir})
		}
		if s.Role != "" {
			cd.Mounts = append(cd.Mounts, cdispec.Mount{Path: d.opts.StatusDir})
			if d.opts.StatusDir != "/dev/shm" {
				cd.Env = append(cd.Env, "NVTASKSET_STATUS_DIR="+d.opts.StatusDir)
			}
		}
		ids := []string{cdispec.QualifiedName(s.CDIName)}
		nv := d.nvidia[s.GPU]
		switch {
		case nv != "":
			ids = append(ids, nv)
		case d.opts.NvidiaCDI == NvidiaCDIRequired:
			return nil, fmt.Errorf("%s: no CDI device %s=%s (install the NVIDIA Container Toolkit's CDI spec, or start the plugin with --nvidia-cdi=auto or off)", s.Device, d.opts.NvidiaKind, s.GPU)
		default:
			cd.Env = append(cd.Env, "NVIDIA_VISIBLE_DEVICES="+s.GPU)
		}
		cdevs = append(cdevs, cd)
		dev := kubeletplugin.Device{Requests: []string{s.Request}, PoolName: s.Pool, DeviceName: s.Device, CDIDeviceIDs: ids}
		if s.ShareID != "" {
			id := types.UID(s.ShareID)
			dev.ShareID = &id
		}
		out = append(out, dev)
	}
	spec, err := cdispec.Build(cdevs)
	if err != nil {
		return nil, err
	}
	if err := d.cdi.Write(uid, spec); err != nil {
		return nil, err
	}
	return out, nil
}

// consumers names the pods a claim is reserved for: "ns/a" or "ns/a,b".
func consumers(c *resourceapi.ResourceClaim) string {
	var pods []string
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			pods = append(pods, ref.Name)
		}
	}
	if len(pods) == 0 {
		return ""
	}
	return c.Namespace + "/" + strings.Join(pods, ",")
}

// label is a holder's command line, which nvtaskset --status shows as
// the share's COMMAND: the pod and the claim.
func label(c checkpoint.Claim) []string {
	l := []string{Name + ":"}
	if c.Pod != "" {
		l = append(l, "pod", c.Pod)
	}
	return append(l, "claim", c.Namespace+"/"+c.Name)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
