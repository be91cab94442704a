// helmrender: `helm template` for the lazyrag chart where Helm is not installed (see
// render.go for what it covers).
//
//	helmrender [-f VALUES.yaml]... [--name RELEASE] [--namespace NS] CHART_DIR
//
// Prints the manifests on stdout; exits 1 with the error on stderr when rendering fails.
package main

import (
	"flag"
	"fmt"
	"os"
)

type fileList []string

func (f *fileList) String() string     { return fmt.Sprint(*f) }
func (f *fileList) Set(s string) error { *f = append(*f, s); return nil }

func main() {
	var opts Options
	var values fileList
	flag.Var(&values, "f", "values file applied over the chart's values.yaml (repeatable)")
	flag.StringVar(&opts.ReleaseName, "name", "release-name", "release name")
	flag.StringVar(&opts.Namespace, "namespace", "default", "release namespace")
	notes := flag.Bool("notes", false, "also print the rendered NOTES.txt on stderr")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: helmrender [-f VALUES.yaml]... [--name RELEASE] [--namespace NS] CHART_DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	opts.ChartDir = flag.Arg(0)
	opts.ValuesFiles = values
	result, err := Render(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmrender:", err)
		os.Exit(1)
	}
	fmt.Print(result.Format())
	if *notes {
		fmt.Fprint(os.Stderr, result.Notes)
	}
}
