package csi

import (
	"github.com/plinth-storage/plinth/csi/controller"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/node"
)

// The names other components and tests use, kept by the services' packages and the volume
// layer, which the driver wires together.

// Keys of the volume context (CreateVolume → PV volumeAttributes → NodeStage) and of the
// publish context (ControllerPublish → NodeStage/NodePublish); see volume.ContextKind.
const (
	ContextKind              = volume.ContextKind
	ContextFSType            = volume.ContextFSType
	ContextMkfsOptions       = volume.ContextMkfsOptions
	ContextMountOptions      = volume.ContextMountOptions
	ContextEncryption        = volume.ContextEncryption
	ContextKeySecret         = volume.ContextKeySecret
	PublishDevicePath        = volume.PublishDevicePath
	PublishNQN               = volume.PublishNQN
	PublishAddress           = volume.PublishAddress
	PublishPort              = volume.PublishPort
	PublishCtrlLossTmo       = volume.PublishCtrlLossTmo
	PublishReconnectDelay    = volume.PublishReconnectDelay
	PublishQueueSize         = volume.PublishQueueSize
	PublishAuth              = volume.PublishAuth
	PublishAuthBidirectional = volume.PublishAuthBidirectional
	PublishTargetNode        = volume.PublishTargetNode
)

// The CreateVolume parameters of csi-provisioner's --extra-create-metadata and the reason of
// the event on a PVC whose overrides are refused (controller.ParamPVCName).
const (
	ParamPVCName          = controller.ParamPVCName
	ParamPVCNamespace     = controller.ParamPVCNamespace
	ReasonOverrideRefused = controller.ReasonOverrideRefused
)

// The node plugin's volume health reasons and period, and the namespace of the DH-HMAC-CHAP
// host Secrets (node.ReasonMountDead, node.DefaultAuthNamespace).
const (
	ReasonMountDead             = node.ReasonMountDead
	ReasonDeviceGone            = node.ReasonDeviceGone
	DefaultVolumeHealthInterval = node.DefaultVolumeHealthInterval
	// DefaultKeyRotationInterval is the period of the controller's key rotation round.
	DefaultKeyRotationInterval = controller.KeyRotationInterval
	DefaultAuthNamespace       = node.DefaultAuthNamespace
)
