package operator

import (
	"encoding/json"
	"fmt"
	"io"
)

// jsonStream writes a document of the form
//
//	{"<head key>": <value>, ..., "<items>": [<item>, ...], "problems": [...]}
//
// byte for byte as WriteJSON would indent it, one item at a time, so that
// a listing of any size is never held whole.
type jsonStream struct {
	w   io.Writer
	n   int
	err error
}

// newJSONStream writes the head fields (key, value pairs, in order) and
// opens the items array.
func newJSONStream(w io.Writer, items string, head ...any) *jsonStream {
	j := &jsonStream{w: w}
	j.write("{\n")
	for i := 0; i+1 < len(head); i += 2 {
		j.write(fmt.Sprintf("  %q: %s,\n", head[i], j.marshal(head[i+1], "  ")))
	}
	j.write(fmt.Sprintf("  %q: [", items))
	return j
}

func (j *jsonStream) item(v any) {
	sep := ",\n    "
	if j.n == 0 {
		sep = "\n    "
	}
	j.n++
	j.write(sep + j.marshal(v, "    "))
}

// end closes the items array, writes the problems one at a time (as
// json.MarshalIndent would lay out their array) and ends the document.
func (j *jsonStream) end(problems *Problems) error {
	if j.n > 0 {
		j.write("\n  ")
	}
	j.write("],\n  \"problems\": [")
	n := 0
	err := problems.Each(func(p string) {
		sep := ",\n    "
		if n == 0 {
			sep = "\n    "
		}
		n++
		j.write(sep + j.marshal(p, "    "))
	})
	if n > 0 {
		j.write("\n  ")
	}
	j.write("]\n}\n")
	if j.err == nil {
		j.err = err
	}
	return j.err
}

func (j *jsonStream) marshal(v any, prefix string) string {
	b, err := json.MarshalIndent(v, prefix, "  ")
	if err != nil && j.err == nil {
		j.err = err
	}
	return string(b)
}

func (j *jsonStream) write(s string) {
	if j.err == nil {
		_, j.err = io.WriteString(j.w, s)
	}
}
