package routingcontrol

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseDocument(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc string
		want      map[string]State
		problem   string // in the error; "" for none
	}{
		{"two regions", `{"regions":{"us-east-1":"on","eu-west-1":"off"}}`, map[string]State{"us-east-1": On, "eu-west-1": Off}, ""},
		{"none named", `{"regions":{}}`, map[string]State{}, ""},
		{"no regions member", `{}`, nil, `no "regions" member`},
		{"null regions", `{"regions":null}`, nil, `no "regions" member`},
		{"unknown member", `{"regions":{},"extra":1}`, nil, "extra"},
		{"bad state", `{"regions":{"us-east-1":"down"}}`, nil, `state "down" is neither`},
		{"capitalised state", `{"regions":{"us-east-1":"On"}}`, nil, `state "On"`},
		{"bad name", `{"regions":{"US_EAST":"on"}}`, nil, `region "US_EAST" is not a region name`},
		{"duplicate region", `{"regions":{"us-east-1":"on","us-east-1":"off"}}`, nil, "duplicate"},
		{"not a string", `{"regions":{"us-east-1":true}}`, nil, "malformed"},
		{"trailing data", `{"regions":{}} {}`, nil, "malformed"},
		{"empty", ``, nil, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDocument([]byte(tc.doc))
			if tc.problem == "" {
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(tc.want, got); d != "" {
					t.Errorf("controls (-want +got):\n%s", d)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.problem) {
				t.Errorf("error %v, want ErrMalformed naming %q", err, tc.problem)
			}
		})
	}
}

func TestParseYAMLDocument(t *testing.T) {
	t.Parallel()
	got, err := ParseYAMLDocument([]byte("regions:\n  us-east-1: on\n  eu-west-1: \"off\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	// YAML 1.1's unquoted on/off are booleans to some decoders; to
	// yaml.v3 into a string they are the strings.
	if d := cmp.Diff(map[string]State{"us-east-1": On, "eu-west-1": Off}, got); d != "" {
		t.Errorf("controls (-want +got):\n%s", d)
	}
	for doc, problem := range map[string]string{
		"regions:\n  a: on\n  a: off\n":   "already defined",
		"regions: {}\nextra: 1\n":         "extra",
		"regions:\n  a: maybe\n":          `state "maybe"`,
		"other: 1\n":                      "other",
		"regions: {}\n---\nregions: {}\n": "more than one",
		"":                                "malformed",
	} {
		if _, err := ParseYAMLDocument([]byte(doc)); err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), problem) {
			t.Errorf("%q: error %v, want ErrMalformed naming %q", doc, err, problem)
		}
	}
}

func TestParseTXT(t *testing.T) {
	t.Parallel()
	got, err := ParseTXT([]string{"us-east-1=on", "eu-west-1=off ap-south-1=on"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]State{"us-east-1": On, "eu-west-1": Off, "ap-south-1": On}, got); d != "" {
		t.Errorf("controls (-want +got):\n%s", d)
	}
	for _, tc := range []struct {
		strs    []string
		problem string
	}{
		{nil, "no strings"},
		{[]string{""}, "holds no region"},
		{[]string{"us-east-1"}, "is not region=on|off"},
		{[]string{"us-east-1=up"}, `state "up"`},
		{[]string{"Us=on"}, "not a region name"},
		{[]string{"a=on", "a=on"}, "named twice"},
		{[]string{"v=spf1 -all"}, "not region=on|off"},
	} {
		if _, err := ParseTXT(tc.strs); err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.problem) {
			t.Errorf("%q: error %v, want ErrMalformed naming %q", tc.strs, err, tc.problem)
		}
	}
}

// FuzzParseDocument: any input parses or is refused as malformed, never
// panics; what parses names only valid regions with on or off, and
// parses again the same once re-encoded.
func FuzzParseDocument(f *testing.F) {
	for _, s := range []string{`{"regions":{"us-east-1":"on","eu-west-1":"off"}}`, `{"regions":{}}`, `{}`, `{"regions":{"a":"x"}}`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseDocument(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		checkControls(t, got)
		var b strings.Builder
		b.WriteString(`{"regions":{`)
		i := 0
		for r, s := range got {
			if i > 0 {
				b.WriteString(",")
			}
			i++
			b.WriteString(`"` + r + `":"` + string(s) + `"`)
		}
		b.WriteString("}}")
		again, err := ParseDocument([]byte(b.String()))
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("re-encoded %s: %v, %v; want %v", b.String(), again, err, got)
		}
	})
}

// FuzzParseTXT: any strings parse or are refused as malformed.
func FuzzParseTXT(f *testing.F) {
	f.Add("us-east-1=on", "eu-west-1=off")
	f.Add("a=on b=off", "")
	f.Add("a=on", "a=off")
	f.Fuzz(func(t *testing.T, a, b string) {
		got, err := ParseTXT([]string{a, b})
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		checkControls(t, got)
		if len(got) != len(strings.Fields(a))+len(strings.Fields(b)) {
			t.Fatalf("%q %q: %d regions, want one per pair", a, b, len(got))
		}
	})
}

func checkControls(t *testing.T, m map[string]State) {
	t.Helper()
	for r, s := range m {
		if !ValidRegion(r) || (s != On && s != Off) {
			t.Fatalf("parsed %q=%q", r, s)
		}
	}
}
