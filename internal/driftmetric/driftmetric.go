// Package driftmetric holds the one definition of plinth_drift_objects, the gauge both the
// policy controller (source "api": rendered API objects edited or deleted outside Plinth) and
// the node agent (source "kernel": LVs, exports, VGs, thin pools that differ from their
// objects) set. A leaf package: the two actors share the metric without importing each other.
package driftmetric

import "github.com/prometheus/client_golang/prometheus"

// Sources of Objects.
const (
	SourceAPI    = "api"
	SourceKernel = "kernel"
)

// Objects is plinth_drift_objects{source, kind}: the number of drifted objects by source
// (SourceAPI, SourceKernel) and kind of the drifted thing. Each actor registers it with its
// registry; a binary that runs both registers it once (the second registration finds the same
// collector).
var Objects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "plinth_drift_objects",
	Help: "Objects drifted from their declaration, by source and kind.",
}, []string{"source", "kind"})
