// SPDX-License-Identifier: Apache-2.0

// Package driver is the DRA kubelet plugin of tpc.nvtaskset.dev: it
// publishes the node's GPUs as devices with a consumable `tpcs` capacity,
// and prepares each allocated share by asking the installed nvtaskset to
// plan and claim it (nvtaskset --env-for), held by a process of the
// plugin's, with a CDI device that carries the partition into the pod.
package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"nvtaskset.dev/k8s/internal/cdispec"
	"nvtaskset.dev/k8s/internal/checkpoint"
	"nvtaskset.dev/k8s/internal/holder"
	"nvtaskset.dev/k8s/internal/nvtaskset"
)

// Name is the driver's name: the DeviceClass, the slices and the CDI kind
// all use it.
const Name = "tpc.nvtaskset.dev"

// CapacityTPCs is the consumable capacity of every device.
const CapacityTPCs resourceapi.QualifiedName = "tpcs"

// NvidiaCDI says how a share's container gets its GPU.
type NvidiaCDI string

const (
	// NvidiaCDIRequired: the NVIDIA Container Toolkit's CDI device for the
	// GPU must exist; Prepare fails otherwise.
	NvidiaCDIRequired NvidiaCDI = "required"
	// NvidiaCDIAuto: its CDI device where one exists, else
	// NVIDIA_VISIBLE_DEVICES for the toolkit's runtime hook.
	NvidiaCDIAuto NvidiaCDI = "auto"
	// NvidiaCDIOff: NVIDIA_VISIBLE_DEVICES only (the toolkit's legacy mode).
	NvidiaCDIOff NvidiaCDI = "off"
)

// Options configure the plugin.
type Options struct {
	NodeName    string
	CLI         *nvtaskset.CLI
	HolderExe   string   // the binary run as a holder (holder.Main); the plugin's own
	StateDir    string   // the checkpoint, and the holders' owner tag
	CDIDir      string   // where the claims' specs are written
	CDISpecDirs []string // where NVIDIA's spec is looked for
	NvidiaCDI   NvidiaCDI
	NvidiaKind  string // nvidia.com/gpu
	MPS         nvtaskset.MPSMode
	MPSPipeDir  string // mounted into every pod when MPS is on
	StatusDir   string // nvtaskset's status entries and beacons: mounted for role shares
	DefaultTPCs int
	Client      kubernetes.Interface
	StopGrace   time.Duration // how long a holder has to end on TERM
	// Fatal is called with a background error that retrying cannot mend.
	Fatal func(error)
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	opts   Options
	cdi    *cdispec.Writer
	owner  string // the holders' tag: the state directory
	ckpt   string // the checkpoint's path
	helper *kubeletplugin.Helper

	mu     sync.Mutex
	state  *checkpoint.State
	gpus   map[string]nvtaskset.GPU // by device name
	nvidia map[string]string        // GPU UUID -> NVIDIA's CDI device ID
	order  []nvtaskset.GPU          // as published
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// CheckStatusDir refuses a status directory that the tasks of role shares
// cannot write: they run as the pods' users, and each creates its status
// entry and (latency-critical) its beacon there; without them a share runs
// without its role (best-effort tasks do not make way). So it must be as
// /dev/shm is: a directory everyone may write, with the sticky bit.
func CheckStatusDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("--status-dir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("--status-dir %s: not a directory", dir)
	}
	if m := st.Mode(); m&0o002 == 0 || m&os.ModeSticky == 0 {
		octal := m.Perm()
		if m&os.ModeSticky != 0 {
			octal |= 0o1000
		}
		return fmt.Errorf("--status-dir %s: mode %04o; the pods of role shares run as any user and create their entries there: use a directory of mode 1777, as /dev/shm", dir, octal)
	}
	return nil
}

// New loads the checkpoint, adopts the claims it lists (or, after a
// reboot, drops them), stops holders nothing lists, and finds the GPUs.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.DefaultTPCs <= 0 {
		opts.DefaultTPCs = DefaultTPCs
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 10 * time.Second
	}
	if opts.NvidiaKind == "" {
		opts.NvidiaKind = "nvidia.com/gpu"
	}
	if opts.HolderExe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		opts.HolderExe = exe
	}
	if err := CheckStatusDir(opts.StatusDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, err
	}
	stateDir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	w, err := cdispec.NewWriter(opts.CDIDir)
	if err != nil {
		return nil, err
	}
	d := &Driver{opts: opts, cdi: w, owner: stateDir, ckpt: filepath.Join(stateDir, "checkpoint.json")}
	if d.state, err = checkpoint.Load(d.ckpt); err != nil {
		return nil, err
	}
	if err := d.Rescan(ctx); err != nil {
		return nil, err
	}
	d.adopt(ctx)
	return d, nil
}

// adopt takes over the claims of the checkpoint: after a reboot none of
// them holds anything any more; a Prepare that was under way is undone;
// a prepared share whose holder died (the plugin's container was
// restarted with it) is claimed again on exactly its TPCs. Holders that
// no entry lists are stopped.
func (d *Driver) adopt(ctx context.Context) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state.BootID != checkpoint.BootID() {
		for uid := range d.state.Claims {
			logger.Info("Dropping a claim prepared before the node rebooted", "claim", uid)
			_ = d.cdi.Remove(uid)
		}
		d.state = checkpoint.New()
	}
	listed := map[holder.Process]bool{}
	for uid, c := range d.state.Claims {
		if !c.Prepared {
			logger.Info("Undoing a Prepare that was under way when the plugin stopped", "claim", klog.KRef(c.Namespace, c.Name))
			d.release(c)
			_ = d.cdi.Remove(uid)
			delete(d.state.Claims, uid)
			continue
		}
		for i := range c.Shares {
			s := &c.Shares[i]
			if s.Holder.Alive() {
				listed[s.Holder] = true
				continue
			}
			if err := d.reclaim(ctx, c, s); err != nil {
				logger.Error(err, "A prepared share lost its holder and could not be claimed again: its pods run on TPCs no longer reserved",
					"claim", klog.KRef(c.Namespace, c.Name), "device", s.Device, "tpcs", s.List)
				continue
			}
			listed[s.Holder] = true
			logger.Info("Claimed a share again on its TPCs", "claim", klog.KRef(c.Namespace, c.Name), "device", s.Device, "tpcs", s.List)
		}
		d.state.Claims[uid] = c
	}
	for _, p := range holder.Running(d.owner) {
		if !listed[p] {
			logger.Info("Stopping a holder no claim lists", "pid", p.PID)
			_ = p.Stop(d.opts.StopGrace)
		}
	}
	if err := checkpoint.Save(d.ckpt, d.state); err != nil {
		logger.Error(err, "Saving the checkpoint")
	}
}

// reclaim gives a share whose holder died a new holder on the same TPCs.
func (d *Driver) reclaim(ctx context.Context, c checkpoint.Claim, s *checkpoint.Share) error {
	if s.List == "" {
		return errors.New("the checkpoint has no TPC list for it")
	}
	p, err := holder.Start(d.opts.HolderExe, label(c), d.owner)
	if err != nil {
		return err
	}
	sh := d.share(s, p.PID)
	sh.List = s.List
	if _, err := d.opts.CLI.Claim(ctx, sh); err != nil {
		_ = p.Stop(d.opts.StopGrace)
		return err
	}
	s.Holder = p
	return nil
}

// release stops every holder of c (their claims end with them).
func (d *Driver) release(c checkpoint.Claim) error {
	var errs []error
	for _, s := range c.Shares {
		if err := s.Holder.Stop(d.opts.StopGrace); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Rescan finds the node's GPUs, and NVIDIA's CDI device of each. It says
// whether they changed since the last scan through the published slices.
func (d *Driver) Rescan(ctx context.Context) error {
	gpus, err := d.opts.CLI.Topology(ctx)
	if err != nil {
		return fmt.Errorf("list the GPUs: %w", err)
	}
	nvidia := map[string]string{}
	if d.opts.NvidiaCDI != NvidiaCDIOff {
		for _, g := range gpus {
			id, err := cdispec.Lookup(d.opts.CDISpecDirs, d.opts.NvidiaKind+"="+g.UUID, d.opts.NvidiaKind+"="+fmt.Sprint(g.Index))
			if err != nil {
				klog.FromContext(ctx).Error(err, "Reading the CDI spec directories", "dirs", d.opts.CDISpecDirs)
			}
			if id != "" {
				nvidia[g.UUID] = id
			}
		}
	}
	byName := map[string]nvtaskset.GPU{}
	for _, g := range gpus {
		byName[DeviceName(g.Index)] = g
	}
	d.mu.Lock()
	changed := !reflect.DeepEqual(gpus, d.order)
	d.gpus, d.nvidia, d.order = byName, nvidia, gpus
	helper := d.helper
	d.mu.Unlock()
	if changed && helper != nil {
		klog.FromContext(ctx).Info("The GPUs changed: publishing them again", "gpus", len(gpus))
		return helper.PublishResources(ctx, Resources(d.opts.NodeName, gpus, d.opts.DefaultTPCs))
	}
	return nil
}

// Start registers with the kubelet, serves its DRA calls and publishes
// the GPUs; then it rescans them every interval until ctx ends.
func (d *Driver) Start(ctx context.Context, rescan time.Duration, opts ...kubeletplugin.Option) error {
	opts = append([]kubeletplugin.Option{
		kubeletplugin.DriverName(Name),
		kubeletplugin.NodeName(d.opts.NodeName),
		kubeletplugin.KubeClient(d.opts.Client),
		kubeletplugin.HealthService(false),
	}, opts...)
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.helper = helper
	gpus := d.order
	d.mu.Unlock()
	if err := helper.PublishResources(ctx, Resources(d.opts.NodeName, gpus, d.opts.DefaultTPCs)); err != nil {
		helper.Stop()
		return err
	}
	if rescan > 0 {
		go func() {
			t := time.NewTicker(rescan)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := d.Rescan(ctx); err != nil {
						klog.FromContext(ctx).Error(err, "Rescanning the GPUs")
					}
				}
			}
		}()
	}
	return nil
}

// Stop stops serving; prepared claims stay held (a restarted plugin
// adopts them).
func (d *Driver) Stop() {
	d.mu.Lock()
	h := d.helper
	d.helper = nil
	d.mu.Unlock()
	if h != nil {
		h.Stop()
	}
}

// HandleError logs background errors (publishing slices); one that
// retrying cannot mend ends the plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.opts.Fatal != nil {
		d.opts.Fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// WatchHealthStatus: health is not reported (the service is off).
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
