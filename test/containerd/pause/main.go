// Command pause is the pod sandbox's only process in test/containerd: it
// holds the pod's namespaces until it is told to stop, as Kubernetes'
// pause image does. It is built static (CGO_ENABLED=0) and packed into an
// OCI image by the test, so that no registry is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
