package csi

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
)

// The driver's events (events.k8s.io/v1): the controller service reports a publication refused
// because another node presents the same host NQN and a PVC's refused overrides; the node plugin
// reports a rejected host NQN registration and a staged volume whose device is gone. Both
// services record through the recorder started here.
//
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// startEvents starts the driver's event recorder, reporting as controller "plinth-csi" (the
// instance is the host name), until ctx ends. Without an API config there is none and events
// are dropped.
func (d *Driver) startEvents(ctx context.Context) error {
	if d.opts.Config == nil {
		return nil
	}
	cs, err := kubernetes.NewForConfig(d.opts.Config)
	if err != nil {
		return fmt.Errorf("events client: %w", err)
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	go func() { <-ctx.Done(); b.Shutdown() }()
	d.events = b.NewRecorder(d.scheme, "plinth-csi")
	return nil
}
