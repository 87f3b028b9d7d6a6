// Command pause is the pod sandbox's process (what the registry's pause image runs): it holds the
// pod's namespaces, reaps orphans when it is a PID namespace's init, and exits on INT or TERM. The
// test cluster reaches no registry, so its sandbox image is built from this.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every exited child: as init of the pod's PID namespace it inherits orphans.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
