// Package operator implements the operator's commands: `leases` shows who
// holds which address and which holders are dead, `gc` runs CHECK's sweep
// by hand. Both read the same state, through the same code, as the plugin.
package operator
