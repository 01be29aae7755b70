package vet

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"cuelang.org/go/cue/ast"
	"cuelang.org/go/cue/literal"
	"cuelang.org/go/cue/token"
)

// appendJSON appends the JSON form of a document's syntax tree, as the CUE YAML decoder
// builds it (structs of fields, lists, string, number, bool and null literals, negative
// numbers as unary minus), to buf. It reports false, with buf in an unspecified state, for
// anything else (such as the "number & 1" a YAML "!!float 1" becomes, or a number written in
// another base): the caller then decodes the CUE value instead. Decoding the tree the schema
// judged avoids parsing the YAML text a second time, and keeps CUE's reading of YAML (1.2:
// "yes" is a string) for the typed decode too.
func appendJSON(buf []byte, e ast.Expr) ([]byte, bool) {
	switch e := e.(type) {
	case *ast.StructLit:
		buf = append(buf, '{')
		for i, el := range e.Elts {
			f, ok := el.(*ast.Field)
			if !ok {
				return buf, false
			}
			name, _, err := ast.LabelName(f.Label)
			if err != nil {
				return buf, false
			}
			if i > 0 {
				buf = append(buf, ',')
			}
			if buf, ok = appendJSONString(buf, name); !ok {
				return buf, false
			}
			buf = append(buf, ':')
			if buf, ok = appendJSON(buf, f.Value); !ok {
				return buf, false
			}
		}
		return append(buf, '}'), true
	case *ast.ListLit:
		buf = append(buf, '[')
		for i, el := range e.Elts {
			if i > 0 {
				buf = append(buf, ',')
			}
			var ok bool
			if buf, ok = appendJSON(buf, el); !ok {
				return buf, false
			}
		}
		return append(buf, ']'), true
	case *ast.UnaryExpr:
		if lit, ok := e.X.(*ast.BasicLit); ok && e.Op == token.SUB && (lit.Kind == token.INT || lit.Kind == token.FLOAT) {
			return appendJSONNumber(append(buf, '-'), lit.Value)
		}
		return buf, false
	case *ast.BasicLit:
		switch e.Kind {
		case token.STRING:
			s, err := literal.Unquote(e.Value)
			if err != nil {
				return buf, false
			}
			return appendJSONString(buf, s)
		case token.INT, token.FLOAT:
			return appendJSONNumber(buf, e.Value)
		case token.TRUE:
			return append(buf, "true"...), true
		case token.FALSE:
			return append(buf, "false"...), true
		case token.NULL:
			return append(buf, "null"...), true
		}
	}
	return buf, false
}

// appendJSONNumber appends a decimal number literal that is valid JSON as it stands (digits,
// an optional fraction and exponent); it reports false for any other form (0x, 0o, _, Inf).
func appendJSONNumber(buf []byte, lit string) ([]byte, bool) {
	if !json.Valid([]byte(lit)) || lit == "" || lit[0] == '-' {
		return buf, false
	}
	return append(buf, lit...), true
}

// appendJSONString appends s as a JSON string; false when s is not valid UTF-8 (JSON would
// replace the invalid bytes, changing the value).
func appendJSONString(buf []byte, s string) ([]byte, bool) {
	if !utf8.ValidString(s) {
		return buf, false
	}
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case '"', '\\':
			buf = append(buf, '\\', c)
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\t':
			buf = append(buf, '\\', 't')
		case '\r':
			buf = append(buf, '\\', 'r')
		default:
			buf = append(buf, `\u00`...)
			buf = strconv.AppendUint(buf, uint64(c)>>4, 16)
			buf = strconv.AppendUint(buf, uint64(c)&0xf, 16)
		}
		start = i + 1
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"'), true
}
