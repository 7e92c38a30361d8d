// Command dashboard-lint checks Grafana dashboard JSON files against Grafana's published schema, the
// grafana-foundation-sdk (generated from the schemas Grafana itself ships): each file is decoded strictly
// (an unknown field, a missing required field or a wrong type anywhere, panel options and Prometheus queries
// included, is an error) and then validated (the schema's constraints, e.g. gridPos.w <= 24).
//
//	dashboard-lint FILE...
//
// Prints one line per problem, "FILE: PATH: MESSAGE", and exits 1 when there was any (2 on bad usage).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-lint FILE...")
		os.Exit(2)
	}
	// The panel types (options, fieldConfig.defaults.custom) and data sources (queries) Grafana ships;
	// without them those parts would be accepted as opaque JSON.
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, file := range os.Args[1:] {
		problems := lint(file)
		for _, problem := range problems {
			fmt.Printf("%s: %s\n", file, problem)
		}
		if len(problems) > 0 {
			failed = true
		} else {
			fmt.Printf("%s: OK\n", file)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func lint(file string) []string {
	raw, err := os.ReadFile(file)
	if err != nil {
		return []string{err.Error()}
	}
	var board dashboard.Dashboard
	problems := messages("", board.UnmarshalJSONStrict(raw))
	if len(problems) > 0 {
		return problems
	}
	// The SDK's strict decoders return an empty error list as a non-nil error, so a decoded panel
	// (PanelOrRowPanel) is dropped from board.Panels, and with it the panels' validation: each panel is
	// decoded and validated on its own below.
	problems = messages("", board.Validate())
	var shape struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &shape); err != nil {
		return append(problems, err.Error())
	}
	for i, panel := range shape.Panels {
		problems = append(problems, lintPanel(fmt.Sprintf("panels[%d]", i), panel)...)
	}
	return problems
}

// lintPanel validates one panel (or a row and the panels in it) that decoded strictly without errors.
func lintPanel(path string, raw json.RawMessage) []string {
	var head struct {
		Type        string            `json:"type"`
		FieldConfig json.RawMessage   `json:"fieldConfig"`
		Targets     []json.RawMessage `json:"targets"`
		Panels      []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return []string{fmt.Sprintf("%s: %v", path, err)}
	}
	if head.Type == "row" {
		var row dashboard.RowPanel
		if err := row.UnmarshalJSONStrict(raw); len(messages("", err)) > 0 {
			return messages(path, err)
		}
		row.Panels = nil // validated one by one, below
		problems := messages(path, row.Validate())
		for i, panel := range head.Panels {
			problems = append(problems, lintPanel(fmt.Sprintf("%s.panels[%d]", path, i), panel)...)
		}
		return problems
	}
	var panel dashboard.Panel
	if err := panel.UnmarshalJSONStrict(raw); len(messages("", err)) > 0 {
		return messages(path, err)
	}
	problems := messages(path, panel.Validate())
	if _, known := cog.ConfigForPanelcfgVariant(head.Type); !known {
		problems = append(problems, fmt.Sprintf("%s.type: unknown panel type %q", path, head.Type))
	}
	// The SDK decodes fieldConfig leniently inside a panel (only .defaults.custom strictly, by the panel
	// type); decode it strictly here so that a misspelt unit or threshold field is caught too.
	if head.FieldConfig != nil {
		var fieldConfig dashboard.FieldConfigSource
		problems = append(problems, messages(path+".fieldConfig", fieldConfig.UnmarshalJSONStrict(head.FieldConfig))...)
	}
	for i, target := range head.Targets {
		query, err := cog.UnmarshalDataquery(target, "")
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s.targets[%d]: %v", path, i, err))
			continue
		}
		// The strict decoder picks a query's schema by the query's own datasource.type; without one, or
		// with one the SDK does not know, the query is kept as opaque JSON and checked by nothing.
		if _, unknown := query.(variants.UnknownDataquery); unknown {
			problems = append(problems, fmt.Sprintf("%s.targets[%d].datasource.type: missing or unknown, "+
				"so the query cannot be checked (give it the data source's type, e.g. prometheus)", path, i))
			continue
		}
		problems = append(problems, messages(fmt.Sprintf("%s.targets[%d]", path, i), query.Validate())...)
	}
	return problems
}

// messages splits the SDK's error list (cog.BuildErrors, each with its JSON path) into one line each,
// prefixed with path. An empty list, which the SDK returns as a non-nil error, gives none.
func messages(path string, err error) []string {
	if err == nil {
		return nil
	}
	prefix := ""
	if path != "" {
		prefix = path + "."
	}
	var list cog.BuildErrors
	if !errors.As(err, &list) {
		return []string{prefix + err.Error()}
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		out = append(out, prefix+e.Error())
	}
	return out
}
