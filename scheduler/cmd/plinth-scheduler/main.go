// Command plinth-scheduler is kube-scheduler with Plinth's PlinthCapacity plugin compiled
// in (scheduler/plugin/capacity); enable it in a KubeSchedulerConfiguration profile as its
// README shows.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/plinth-storage/plinth/scheduler/plugin/capacity"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(app.WithPlugin(capacity.Name, capacity.New))))
}
