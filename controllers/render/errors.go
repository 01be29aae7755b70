package render

import "errors"

func joinErrors(errs []error) error { return errors.Join(errs...) }

// Errors unpacks the error Render returns into its parts (each usually an *Error), in order;
// a single error is returned as the one part, nil as none.
func Errors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Errors(e)...)
		}
		return out
	}
	return []error{err}
}
