package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// applyBody encodes an unstructured object (maps, slices and the JSON scalars that
// runtime.DefaultUnstructuredConverter produces) as a block-style YAML document for a
// server-side apply (content type application/apply-patch+yaml). Strings and keys are written
// as JSON strings, which are YAML double-quoted scalars with the same escapes, so no value is
// ever read as another type; map keys are sorted, so the bytes depend only on the object.
//
// Why not JSON, which is valid YAML too: the API server decodes every apply body with
// sigs.k8s.io/yaml (go-yaml v2, then JSON), and go-yaml parses a one-line JSON document several
// times slower than the same document in block style (its token queue grows with the line and
// is shifted on every mapping key): for a rendered Store about 150–200 µs and 63 KB allocated
// against 60–70 µs and 21 KB, per apply (BenchmarkApplyBodyDecode). The error names a value of
// a type the encoder does not know.
func applyBody(obj map[string]any) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(1024)
	if err := yamlMap(&b, obj, 0); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func yamlMap(b *bytes.Buffer, m map[string]any, indent int) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		writeIndent(b, indent)
		yamlString(b, k)
		b.WriteByte(':')
		if err := yamlValue(b, m[k], indent); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

// yamlValue writes v after a mapping key or a sequence dash at indent: " scalar\n", or a
// newline and v's entries indented by two more.
func yamlValue(b *bytes.Buffer, v any, indent int) error {
	switch t := v.(type) {
	case map[string]any:
		if len(t) == 0 {
			b.WriteString(" {}\n")
			return nil
		}
		b.WriteByte('\n')
		return yamlMap(b, t, indent+2)
	case []any:
		if len(t) == 0 {
			b.WriteString(" []\n")
			return nil
		}
		b.WriteByte('\n')
		for i, e := range t {
			writeIndent(b, indent+2)
			b.WriteByte('-')
			if err := yamlValue(b, e, indent+2); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return nil
	}
	b.WriteByte(' ')
	switch t := v.(type) {
	case string:
		yamlString(b, t)
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case nil:
		b.WriteString("null")
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case int:
		b.WriteString(strconv.Itoa(t))
	case int32:
		b.WriteString(strconv.FormatInt(int64(t), 10))
	case float64, json.Number:
		j, err := json.Marshal(t) // JSON's number form, which YAML reads as the same number
		if err != nil {
			return err
		}
		b.Write(j)
	default:
		return fmt.Errorf("value of type %T", v)
	}
	b.WriteByte('\n')
	return nil
}

// writeIndent writes n spaces without allocating them (one call per line of every apply).
func writeIndent(b *bytes.Buffer, n int) {
	for range n {
		b.WriteByte(' ')
	}
}

func yamlString(b *bytes.Buffer, s string) {
	j, _ := json.Marshal(s) // a string always marshals
	b.Write(j)
}
