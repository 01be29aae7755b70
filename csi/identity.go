package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// identity is the CSI Identity service.
type identity struct {
	csipb.UnimplementedIdentityServer
	d *Driver
}

func (s *identity) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: policyv1.DriverName, VendorVersion: s.d.opts.Version}, nil
}

func (s *identity) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	caps := []*csipb.PluginCapability{}
	if s.d.controllerMode() {
		caps = append(caps,
			&csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE}}},
			&csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}}},
			&csipb.PluginCapability{Type: &csipb.PluginCapability_VolumeExpansion_{VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{Type: csipb.PluginCapability_VolumeExpansion_ONLINE}}},
			// controller/group.go
			&csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_GROUP_CONTROLLER_SERVICE}}},
		)
	} else {
		caps = append(caps,
			&csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}}},
		)
	}
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe reports ready once the API informers have synced and the services are registered.
func (s *identity) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(s.d.ready.Load())}, nil
}
