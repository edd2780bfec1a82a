package routingcontrol

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"go.yaml.in/yaml/v3"
)

// State is a region's routing control: On (the region takes traffic) or
// Off (it is declared unhealthy).
type State string

// The two states, as documents spell them.
const (
	On  State = "on"
	Off State = "off"
)

// MaxDocumentBytes bounds a document (file or HTTPS body): a routing
// control document names a handful of regions.
const MaxDocumentBytes = 64 << 10

// ErrMalformed marks a document or TXT record that does not parse; the
// error says what is wrong with it.
var ErrMalformed = errors.New("malformed routing controls")

// regionRE is a region name: a DNS label (us-east-1, eu-west-1, local).
var regionRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidRegion reports whether s may name a region: a DNS label of
// lowercase letters, digits and '-'.
func ValidRegion(s string) bool { return regionRE.MatchString(s) }

// document is the file and HTTPS format:
//
//	{"regions": {"us-east-1": "on", "eu-west-1": "off"}}
//
// regions is required (an empty object names no region: all On).
type document struct {
	Regions *map[string]string `json:"regions" yaml:"regions"`
}

// ParseDocument decodes a JSON document strictly: unknown members,
// duplicate regions, a bad region name or a state other than "on" or
// "off" are errors naming the problem (wrapping ErrMalformed).
func ParseDocument(data []byte) (map[string]State, error) {
	if len(data) > MaxDocumentBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than the %d-byte limit", ErrMalformed, len(data), MaxDocumentBytes)
	}
	var doc document
	if err := jsonv2.Unmarshal(data, &doc, jsonv2.RejectUnknownMembers(true)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return doc.controls()
}

// ParseYAMLDocument decodes the same document written in YAML, as
// strictly (yaml.v3 refuses duplicate keys; unknown keys are refused).
func ParseYAMLDocument(data []byte) (map[string]State, error) {
	if len(data) > MaxDocumentBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than the %d-byte limit", ErrMalformed, len(data), MaxDocumentBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var doc document
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	var extra any
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrMalformed)
	}
	return doc.controls()
}

func (d document) controls() (map[string]State, error) {
	if d.Regions == nil {
		return nil, fmt.Errorf(`%w: no "regions" member (write {"regions": {}} to name no region)`, ErrMalformed)
	}
	out := make(map[string]State, len(*d.Regions))
	var problems []string
	for _, region := range slices.Sorted(maps.Keys(*d.Regions)) {
		st, err := parseState(region, (*d.Regions)[region])
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		out[region] = st
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrMalformed, strings.Join(problems, "; "))
	}
	return out, nil
}

func parseState(region, state string) (State, error) {
	if !ValidRegion(region) {
		return "", fmt.Errorf("region %q is not a region name (a DNS label of a-z, 0-9 and '-')", region)
	}
	switch State(state) {
	case On, Off:
		return State(state), nil
	}
	return "", fmt.Errorf("region %s: state %q is neither \"on\" nor \"off\"", region, state)
}

// ParseTXT reads the strings of a TXT record set: each string holds one
// or more whitespace-separated region=on|off pairs, e.g.
//
//	_muster-routing.example.org. TXT "us-east-1=on" "eu-west-1=off"
//
// A region named twice (even with the same state), a string that is not
// such pairs, a bad region name or state is an error naming the problem.
func ParseTXT(strs []string) (map[string]State, error) {
	out := map[string]State{}
	var problems []string
	for _, s := range strs {
		fields := strings.Fields(s)
		if len(fields) == 0 {
			problems = append(problems, fmt.Sprintf("string %q holds no region=on|off pair", s))
			continue
		}
		for _, f := range fields {
			region, state, ok := strings.Cut(f, "=")
			if !ok {
				problems = append(problems, fmt.Sprintf("%q is not region=on|off", f))
				continue
			}
			st, err := parseState(region, state)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			if _, dup := out[region]; dup {
				problems = append(problems, fmt.Sprintf("region %s is named twice", region))
				continue
			}
			out[region] = st
		}
	}
	if len(strs) == 0 {
		problems = append(problems, "the record has no strings")
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrMalformed, strings.Join(problems, "; "))
	}
	return out, nil
}
