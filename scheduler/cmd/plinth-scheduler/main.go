// Command plinth-scheduler is kube-scheduler with Plinth's out-of-tree plugins
// compiled in. Today it is the stock scheduler: the PlinthCapacity plugin is
// registered here (app.WithPlugin) by the scheduler plugin issue.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
