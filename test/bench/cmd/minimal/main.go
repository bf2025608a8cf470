// Command minimal is the floor of the cold-start benchmark: a static Go
// binary that does nothing but print the answer a CNI plugin gives to
// VERSION. It links only the runtime and os, so exec to exit is the cost
// of starting any Go program on this machine.
package main

import "os"

func main() {
	os.Stdout.WriteString(`{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}` + "\n")
}
