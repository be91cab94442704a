// Package main renders a Helm chart the way `helm template` does, without Helm.
//
// Helm is not packaged in the registries this project builds from, so this renderer stands
// in for it in tests: Go's text/template with the sprig function library (Debian's
// golang-github-masterminds-sprig-dev, the library Helm itself uses) plus the Helm-specific
// functions our chart uses: include, required, toYaml, fromYaml, lookup (empty, as in
// `helm template`). Like Helm it removes env and expandenv, renders with missingkey=zero and
// blanks "<no value>", skips partials (files starting with "_") and NOTES.txt in the output,
// and reads values through YAML->JSON semantics: every number is a float64, so a template
// that prints a large integer without int64 shows 5.1539607552e+10 here exactly as under
// Helm.
//
// .Files offers Get (a file of the chart folder as a string, "" when missing), as Helm's does.
// Not covered: chart dependencies (subcharts), the other .Files methods, tpl, .Capabilities.APIVersions,
// hooks, schema validation (values.schema.json: tests/deploy/chart_check.py schema checks it), --set, and Helm's kind-based output order
// (manifests come out in file-name order).
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"

	sprig "github.com/Masterminds/sprig"
	yaml "gopkg.in/yaml.v3"
)

// Options of one render.
type Options struct {
	ChartDir    string   // folder with Chart.yaml, values.yaml and templates/
	ValuesFiles []string // applied in order over the chart's values.yaml (like helm -f)
	ReleaseName string   // .Release.Name; default "release-name" as in `helm template`
	Namespace   string   // .Release.Namespace; default "default"
}

// Manifest is one rendered YAML document and the template it came from.
type Manifest struct {
	Source  string // e.g. "lazyrag/templates/kvstore-statefulset.yaml"
	Content string
}

// Result of a render.
type Result struct {
	Manifests []Manifest
	Notes     string                 // rendered NOTES.txt, if the chart has one
	Values    map[string]interface{} // the merged values the templates saw
	Chart     map[string]interface{} // .Chart
}

var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// Render renders every template of the chart.
func Render(opts Options) (*Result, error) {
	if opts.ReleaseName == "" {
		opts.ReleaseName = "release-name"
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	chart, err := loadChart(filepath.Join(opts.ChartDir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	values, err := loadYAMLMap(filepath.Join(opts.ChartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	for _, f := range opts.ValuesFiles {
		override, err := loadYAMLMap(f)
		if err != nil {
			return nil, err
		}
		values = mergeValues(values, override)
	}

	chartName, _ := chart["Name"].(string)
	root := template.New(chartName).Option("missingkey=zero")
	root.Funcs(funcMap(root))

	templatesDir := filepath.Join(opts.ChartDir, "templates")
	var names []string
	err = filepath.Walk(templatesDir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml", ".tpl", ".txt":
		default:
			return nil
		}
		rel, err := filepath.Rel(opts.ChartDir, path)
		if err != nil {
			return err
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		name := chartName + "/" + filepath.ToSlash(rel)
		if _, err := root.New(name).Parse(string(text)); err != nil {
			return fmt.Errorf("parse error in %s: %w", name, err)
		}
		names = append(names, name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(names)

	result := &Result{Values: values, Chart: chart}
	for _, name := range names {
		base := filepath.Base(name)
		if strings.HasPrefix(base, "_") {
			continue
		}
		data := map[string]interface{}{
			"Values": values,
			"Chart":  chart,
			"Files":  Files{dir: opts.ChartDir},
			"Release": map[string]interface{}{
				"Name": opts.ReleaseName, "Namespace": opts.Namespace, "Service": "Helm",
				"IsInstall": true, "IsUpgrade": false, "Revision": 1,
			},
			"Capabilities": map[string]interface{}{
				"KubeVersion": map[string]interface{}{"Version": "v1.29.0", "Major": "1", "Minor": "29"},
			},
			"Template": map[string]interface{}{
				"Name": name, "BasePath": chartName + "/templates",
			},
		}
		var out bytes.Buffer
		if err := root.ExecuteTemplate(&out, name, data); err != nil {
			return nil, fmt.Errorf("execution error in %s: %w", name, err)
		}
		text := strings.ReplaceAll(out.String(), "<no value>", "")
		if base == "NOTES.txt" {
			result.Notes = text
			continue
		}
		for _, doc := range documentSeparator.Split(text, -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			result.Manifests = append(result.Manifests, Manifest{Source: name, Content: strings.Trim(doc, "\n") + "\n"})
		}
	}
	return result, nil
}

// Files is Helm's .Files, reduced to Get.
type Files struct{ dir string }

// Get returns the chart file at path (relative to the chart folder), or "" as Helm does when
// the file is missing or outside the chart.
func (f Files) Get(path string) string {
	clean := filepath.Clean(filepath.FromSlash(path))
	if filepath.IsAbs(clean) || strings.HasPrefix(clean, "..") {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(f.dir, clean))
	if err != nil {
		return ""
	}
	return string(b)
}

// Format writes the manifests as `helm template` prints them.
func (r *Result) Format() string {
	var b strings.Builder
	for _, m := range r.Manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s", m.Source, m.Content)
	}
	return b.String()
}

func funcMap(root *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	// Helm drops these two: a chart must not read the environment of whoever renders it.
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["required"] = func(message string, value interface{}) (interface{}, error) {
		if value == nil {
			return value, errors.New(message)
		}
		if s, ok := value.(string); ok && s == "" {
			return value, errors.New(message)
		}
		return value, nil
	}
	f["include"] = func(name string, data interface{}) (string, error) {
		var b bytes.Buffer
		if err := root.ExecuteTemplate(&b, name, data); err != nil {
			return "", err
		}
		return b.String(), nil
	}
	// `helm template` has no cluster to look objects up in: lookup answers an empty map.
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

// toYAML is Helm's toYaml: YAML with sorted keys, no trailing newline. Integral numbers print
// as integers (Helm goes through JSON, where 8 is 8, not 8.0).
func toYAML(v interface{}) string {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(integralFloatsToInts(v)); err != nil {
		return ""
	}
	enc.Close()
	return strings.TrimSuffix(b.String(), "\n")
}

// fromYAML is Helm's fromYaml: a map, or {"Error": message} when the text does not parse.
func fromYAML(text string) map[string]interface{} {
	var v interface{}
	if err := yaml.Unmarshal([]byte(text), &v); err != nil {
		return map[string]interface{}{"Error": err.Error()}
	}
	m, ok := normalize(v).(map[string]interface{})
	if !ok {
		return map[string]interface{}{}
	}
	return m
}

// loadChart reads Chart.yaml into the shape of Helm's .Chart (Name, Version, AppVersion...).
func loadChart(path string) (map[string]interface{}, error) {
	raw, err := loadYAMLMap(path)
	if err != nil {
		return nil, err
	}
	chart := map[string]interface{}{}
	for k, v := range raw {
		key := strings.ToUpper(k[:1]) + k[1:]
		if k == "apiVersion" {
			key = "APIVersion"
		}
		chart[key] = v
	}
	if name, _ := chart["Name"].(string); name == "" {
		return nil, fmt.Errorf("%s: no name", path)
	}
	return chart, nil
}

func loadYAMLMap(path string) (map[string]interface{}, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v interface{}
	if err := yaml.Unmarshal(text, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if v == nil {
		return map[string]interface{}{}, nil
	}
	m, ok := normalize(v).(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: not a YAML mapping", path)
	}
	return m, nil
}

// normalize gives decoded YAML the types Helm's values have after its YAML->JSON step:
// string map keys and float64 numbers.
func normalize(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			t[k] = normalize(x)
		}
		return t
	case map[interface{}]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = normalize(x)
		}
		return m
	case []interface{}:
		for i, x := range t {
			t[i] = normalize(x)
		}
		return t
	case int:
		return float64(t)
	case int64:
		return float64(t)
	case uint64:
		return float64(t)
	default:
		return v
	}
}

func integralFloatsToInts(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, x := range t {
			m[k] = integralFloatsToInts(x)
		}
		return m
	case []interface{}:
		s := make([]interface{}, len(t))
		for i, x := range t {
			s[i] = integralFloatsToInts(x)
		}
		return s
	case float64:
		if t == float64(int64(t)) {
			return int64(t)
		}
		return t
	default:
		return v
	}
}

// mergeValues applies override over base as helm -f does: maps merge key by key, anything
// else replaces, and a null in override deletes the key.
func mergeValues(base, override map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(base))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range override {
		if v == nil {
			delete(out, k)
			continue
		}
		baseMap, baseIsMap := out[k].(map[string]interface{})
		overMap, overIsMap := v.(map[string]interface{})
		if baseIsMap && overIsMap {
			out[k] = mergeValues(baseMap, overMap)
		} else {
			out[k] = v
		}
	}
	return out
}
