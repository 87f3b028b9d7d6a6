// SPDX-License-Identifier: Apache-2.0

// Package kubeletsim plays the parts of a cluster around the plugin, for its
// tests, its benchmark and its GPU check: the scheduler's allocator
// (k8s.io/dynamic-resource-allocation/structured, over the slices the
// plugin published), the API server (client-go's fake clientset), the
// kubelet's calls on the plugin's real sockets (registration, then
// NodePrepareResources and NodeUnprepareResources over gRPC), and a
// container runtime's CDI injection (the CDI library).
package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Driver is the plugin's name, as it registers.
const Driver = "tpc.nvtaskset.dev"

// NewAPI is a fake API server that knows the node (the plugin's slices
// are owned by the node object).
func NewAPI(node string) *fake.Clientset {
	return fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: types.UID(node + "-uid")}})
}

// Kubelet calls one plugin as the kubelet does.
type Kubelet struct {
	API      *fake.Clientset
	Endpoint string // the plugin's DRA socket, from its registration
	conn     *grpc.ClientConn
}

func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix:"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix:"))
		}))
}

// Register does what the kubelet's plugin watcher does with the socket in
// its registry directory: GetInfo, then NotifyRegistrationStatus.
func Register(ctx context.Context, api *fake.Clientset, registryDir string) (*Kubelet, *registerapi.PluginInfo, error) {
	var socks []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		socks, _ = filepath.Glob(filepath.Join(registryDir, "*.sock"))
		if len(socks) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(socks) != 1 {
		return nil, nil, fmt.Errorf("registration sockets in %s: %v", registryDir, socks)
	}
	conn, err := dial(socks[0])
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("GetInfo: %w", err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		return nil, nil, fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	k := &Kubelet{API: api, Endpoint: info.Endpoint}
	if k.conn, err = dial(info.Endpoint); err != nil {
		return nil, nil, err
	}
	return k, info, nil
}

// Close drops the connection.
func (k *Kubelet) Close() { k.conn.Close() }

// Prepare stores the allocated claims in the API and calls
// NodePrepareResources for them, as the kubelet does before their pod.
func (k *Kubelet) Prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodePrepareResourceResponse, error) {
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		_ = k.API.ResourceV1().ResourceClaims(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{})
		if _, err := k.API.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	resp, err := drapb.NewDRAPluginClient(k.conn).NodePrepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

// Unprepare calls NodeUnprepareResources, as the kubelet does once no pod
// uses the claims.
func (k *Kubelet) Unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodeUnprepareResourceResponse, error) {
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	resp, err := drapb.NewDRAPluginClient(k.conn).NodeUnprepareResources(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

// Slices waits for the ResourceSlices the plugin publishes in the API.
func Slices(ctx context.Context, api *fake.Clientset) ([]*resourceapi.ResourceSlice, error) {
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		l, err := api.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) > 0 {
			var out []*resourceapi.ResourceSlice
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no ResourceSlice published: %v", err)
		}
	}
}

// Claim is a claim of the DeviceClass `class` for tpcs TPCs (0: it names
// no capacity), with the given opaque configurations (raw JSON).
func Claim(namespace, name, class string, tpcs int64, opaque ...string) *resourceapi.ResourceClaim {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	if tpcs > 0 {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"tpcs": *resource.NewQuantity(tpcs, resource.DecimalSI)}}
	}
	var cfgs []resourceapi.DeviceClaimConfiguration
	for _, raw := range opaque {
		cfgs = append(cfgs, resourceapi.DeviceClaimConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: Driver, Parameters: rawExtension(raw)}}})
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}, Config: cfgs}},
	}
}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, errors.New("no DeviceClass " + name)
}

// Scheduler allocates claims as kube-scheduler does: with the structured
// allocator over the slices, counting what the claims it allocated before
// consume of each shared device.
type Scheduler struct {
	Node      string
	Slices    []*resourceapi.ResourceSlice
	Classes   []*resourceapi.DeviceClass
	allocated []*resourceapi.ResourceClaim
}

// Allocate fills c.Status.Allocation and reserves the claim for pod;
// false when it cannot be allocated now.
func (s *Scheduler) Allocate(ctx context.Context, c *resourceapi.ResourceClaim, pod string) (bool, error) {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, done := range s.allocated {
		for _, r := range done.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	al, err := structured.NewAllocator(ctx, structured.Features{ConsumableCapacity: true}, state,
		classLister(s.Classes), s.Slices, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		return false, err
	}
	res, err := al.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Node}}, []*resourceapi.ResourceClaim{c})
	if err != nil || res == nil {
		return false, err
	}
	c.Status.Allocation = &res[0]
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID("pod-" + pod)}}
	s.allocated = append(s.allocated, c)
	return true, nil
}

// Release forgets a claim's allocation (the claim was deleted).
func (s *Scheduler) Release(c *resourceapi.ResourceClaim) {
	for i, x := range s.allocated {
		if x == c {
			s.allocated = append(s.allocated[:i], s.allocated[i+1:]...)
			return
		}
	}
}

// Edits is what a container runtime applies for the CDI devices ids: the
// CDI library injects them into an OCI spec, reading specDirs.
func Edits(specDirs []string, ids ...string) (*oci.Spec, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	for path, errs := range cache.GetErrors() {
		return nil, fmt.Errorf("CDI spec %s is invalid: %v", path, errs)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		return nil, err
	}
	return spec, nil
}

// Claims lists the claims allocated and not yet released.
func (s *Scheduler) Claims() []*resourceapi.ResourceClaim {
	return append([]*resourceapi.ResourceClaim(nil), s.allocated...)
}
