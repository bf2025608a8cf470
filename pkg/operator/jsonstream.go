package operator

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// output writes until a write fails and keeps that first error: the rest
// of a listing is not written to a closed pipe.
type output struct {
	w   io.Writer
	err error
}

func (o *output) printf(format string, args ...any) {
	if o.err == nil {
		_, o.err = fmt.Fprintf(o.w, format, args...)
	}
}

// printable gives printf the fields of a line, each as
// statefile.Printable makes it: they come from files and processes.
func printable(fields ...string) []any {
	out := make([]any, len(fields))
	for i, f := range fields {
		out[i] = statefile.Printable(f)
	}
	return out
}

// keep keeps err unless an earlier error is kept, and returns the first.
func (o *output) keep(err error) error {
	if o.err == nil {
		o.err = err
	}
	return o.err
}

// jsonStream writes a document of the form
//
//	{"<head key>": <value>, ..., "<items>": [<item>, ...], "problems": [...]}
//
// byte for byte as WriteJSON would indent it, one item at a time, so that
// a listing of any size is never held whole.
type jsonStream struct {
	output
	n int // items in the array open
}

// newJSONStream writes the head fields (key, value pairs, in order) and
// opens the items array.
func newJSONStream(w io.Writer, items string, head ...any) *jsonStream {
	j := &jsonStream{output: output{w: w}}
	j.printf("{\n")
	for i := 0; i+1 < len(head); i += 2 {
		j.printf("  %q: %s,\n", head[i], j.marshal(head[i+1], "  "))
	}
	j.printf("  %q: [", items)
	return j
}

// Row and Release make it the sink of `leases --json` and of `gc --json`.
func (j *jsonStream) Row(r Row)           { j.item(r) }
func (j *jsonStream) Release(r GCRelease) { j.item(r) }

// Kept is the table's note: the document has no field for it.
func (j *jsonStream) Kept(string, int) {}

func (j *jsonStream) item(v any) {
	sep := ",\n    "
	if j.n == 0 {
		sep = "\n    "
	}
	j.n++
	j.printf("%s%s", sep, j.marshal(v, "    "))
}

// closeArray ends the array open as json.MarshalIndent lays it out.
func (j *jsonStream) closeArray() {
	if j.n > 0 {
		j.printf("\n  ")
	}
	j.printf("]")
	j.n = 0
}

// End closes the items array, writes the problems one at a time and ends
// the document.
func (j *jsonStream) End(problems *Problems) error {
	j.closeArray()
	j.printf(",\n  \"problems\": [")
	err := problems.Each(func(p string) { j.item(p) })
	j.closeArray()
	j.printf("\n}\n")
	return j.keep(err)
}

// fail ends the document of a command that could not start (its data
// dir not listed, its runtime not asked): no items, no problems, and why
// in "error", a field no other document has.
func (j *jsonStream) fail(err error) error {
	j.closeArray()
	j.printf(",\n  \"problems\": [],\n  \"error\": %s\n}\n", j.marshal(err.Error(), "  "))
	return j.err
}

func (j *jsonStream) marshal(v any, prefix string) string {
	b, err := json.MarshalIndent(v, prefix, "  ")
	j.keep(err)
	return string(statefile.PrintableJSON(b))
}
