//go:build !(linux && amd64)

package main

import (
	"fmt"
	"runtime"
)

func trace(options) (report, int, error) {
	return report{}, 0, fmt.Errorf("only linux/amd64 is supported (syscall numbers, register layout), not %s/%s", runtime.GOOS, runtime.GOARCH)
}
