package aggregate

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// form is the name of a rule and of its parameters.
type form struct {
	name   string
	params []string
}

// syntax lists the rules Parse reads, in the order errors list them.
var syntax = []form{
	{"mean", nil},
	{"median", nil},
	{"trimmed_mean", []string{"f"}},
	{"krum", []string{"f"}},
	{"multi_krum", []string{"f", "m"}},
	{"centered_clip", []string{"tau", "iterations"}},
}

// Parse returns the rule that s names in the form its String method
// gives, such as "krum(1)" or "centered_clip(10, 3)"; spaces around the
// name and the parameters are ignored. When s has none of these forms the
// error names s and lists the forms; when a parameter is out of range it
// is the error the rule's Check would return.
func Parse(s string) (Rule, error) {
	r, err := parse(s)
	if err != nil {
		return nil, fmt.Errorf("aggregate: cannot parse rule %q: %w; accepted forms: %s", s, err, acceptedForms())
	}
	if bad, ok := r.(invalid); ok {
		return nil, bad.Check(0)
	}
	return r, nil
}

func parse(s string) (Rule, error) {
	name, rest, paren := strings.Cut(strings.TrimSpace(s), "(")
	name = strings.TrimSpace(name)
	var args []string
	if paren {
		inner, ok := strings.CutSuffix(rest, ")")
		if !ok {
			return nil, errors.New("parameters must end with ')'")
		}
		args = strings.Split(inner, ",")
	}
	i := slices.IndexFunc(syntax, func(f form) bool { return f.name == name })
	if i < 0 {
		return nil, fmt.Errorf("unknown rule %q", name)
	}
	params := syntax[i].params
	if len(args) != len(params) {
		return nil, fmt.Errorf("want %v", syntax[i])
	}
	ints := make([]int, len(params))
	var tau float64
	for k, p := range params {
		a := strings.TrimSpace(args[k])
		var err error
		if p == "tau" {
			if tau, err = strconv.ParseFloat(a, 64); err != nil {
				return nil, fmt.Errorf("tau %q is not a number", a)
			}
		} else if ints[k], err = strconv.Atoi(a); err != nil {
			return nil, fmt.Errorf("%s %q is not an integer", p, a)
		}
	}
	switch name {
	case "mean":
		return Mean(), nil
	case "median":
		return Median(), nil
	case "trimmed_mean":
		return TrimmedMean(ints[0]), nil
	case "krum":
		return Krum(ints[0]), nil
	case "multi_krum":
		return MultiKrum(ints[0], ints[1]), nil
	default:
		return CenteredClip(tau, ints[1]), nil
	}
}

// String returns f as the package documentation writes it: "krum(f)".
func (f form) String() string {
	if len(f.params) == 0 {
		return f.name
	}
	return f.name + "(" + strings.Join(f.params, ",") + ")"
}

func acceptedForms() string {
	all := make([]string, len(syntax))
	for i, f := range syntax {
		all[i] = f.String()
	}
	return strings.Join(all, ", ")
}
