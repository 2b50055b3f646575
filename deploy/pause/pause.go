// pause: the pod sandbox's first process (containerd's sandbox_image) on the test rig's real
// node, built here because no registry is reachable. It holds the pod's namespaces open and exits
// on SIGTERM/SIGINT, like registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
}
