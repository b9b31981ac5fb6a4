package storage

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DriverName is the stand-in driver's CSI name.
const DriverName = "fake.csi.capr.io"

// Publication is one ControllerPublish call: which volume to which node, and when.
type Publication struct {
	Volume, Node string
	Time         time.Time
}

// Driver is a stand-in CSI controller plugin for single-node-writer volumes: ControllerPublish
// attaches a volume to one node and refuses (FAILED_PRECONDITION, as the CSI spec says for a volume
// published to another node) while it is published elsewhere; ControllerUnpublish detaches
// (idempotent). It records every refused publication, so a test can check that nothing ever asked
// for a second writer.
// It serves the CSI Identity and Controller services on a unix socket, as a real driver's controller
// plugin does for the external-attacher.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	Socket string

	mu        sync.Mutex
	published map[string]string // volume → node
	refused   []Publication
	server    *grpc.Server
}

// StartDriver serves a Driver on a unix socket in dir (keep dir short: a socket path is limited to
// about 100 bytes).
func StartDriver(dir string) (*Driver, error) {
	d := &Driver{Socket: filepath.Join(dir, "csi.sock"), published: map[string]string{}}
	_ = os.Remove(d.Socket)
	lis, err := net.Listen("unix", d.Socket)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", d.Socket, err)
	}
	d.server = grpc.NewServer()
	csi.RegisterIdentityServer(d.server, d)
	csi.RegisterControllerServer(d.server, d)
	go func() { _ = d.server.Serve(lis) }()
	return d, nil
}

// Stop stops serving.
func (d *Driver) Stop() {
	d.server.Stop()
	_ = os.Remove(d.Socket)
}

// GetPluginInfo implements csi.IdentityServer.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: "v0.0.0-stand-in"}, nil
}

// GetPluginCapabilities implements csi.IdentityServer.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

// Probe implements csi.IdentityServer.
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// ControllerGetCapabilities implements csi.ControllerServer.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME}},
	}}}, nil
}

// ControllerPublishVolume implements csi.ControllerServer.
func (d *Driver) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and node_id are required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := Publication{Volume: req.GetVolumeId(), Node: req.GetNodeId(), Time: time.Now()}
	switch on := d.published[p.Volume]; on {
	case p.Node:
		return &csi.ControllerPublishVolumeResponse{}, nil
	case "":
		d.published[p.Volume] = p.Node
		return &csi.ControllerPublishVolumeResponse{}, nil
	default:
		d.refused = append(d.refused, p)
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to node %s", p.Volume, on)
	}
}

// ControllerUnpublishVolume implements csi.ControllerServer.
func (d *Driver) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if on, ok := d.published[req.GetVolumeId()]; ok && (req.GetNodeId() == "" || on == req.GetNodeId()) {
		delete(d.published, req.GetVolumeId())
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// PublishedTo returns the node a volume is published to ("" when none).
func (d *Driver) PublishedTo(volume string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.published[volume]
}

// Refused returns the publications refused because the volume was published elsewhere.
func (d *Driver) Refused() []Publication {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Publication(nil), d.refused...)
}
