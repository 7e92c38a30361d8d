// Argo CD's application controller and repo server for the e2e tier (e2e/argocd.py), one binary that runs
// the component named by its first argument:
//
//	argocd application-controller [flags]
//	argocd repo-server [flags]
//
// Only these two command packages are imported: it compiles far less than Argo CD's multi-call main
// (which links the API server, the UI assets and the CLI). Built by ../build.sh.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/util/log"
)

// As upstream's cmd/main.go: client-go's klog lines go through Argo CD's logrus logger. Upstream's
// grpc.DisableSRVLookups() is left out: without the grpclb balancer linked in, it panics.
func init() {
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	commands := map[string]func() *cobra.Command{
		"application-controller": appcontroller.NewCommand,
		"repo-server":            reposerver.NewCommand,
	}
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: argocd application-controller|repo-server [flags]")
		os.Exit(2)
	}
	command := commands[os.Args[1]]()
	command.SetArgs(os.Args[2:])
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
