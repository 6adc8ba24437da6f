// Renders Markdown documents the way the KFP UI's MarkdownViewer does: markdown-to-jsx with raw HTML
// parsing off and links as external links, the content cut at 400,000 characters (with the UI's banner).
// Usage: node render_markdown.js <folder with node_modules/>  (stdin: JSON list of documents;
// stdout: JSON list of HTML fragments)
const path = require('path');
const fs = require('fs');

const modules = path.join(process.argv[2], 'node_modules');
const React = require(path.join(modules, 'react'));
const { renderToStaticMarkup } = require(path.join(modules, 'react-dom', 'server'));
const mdjsx = require(path.join(modules, 'markdown-to-jsx'));
const Markdown = mdjsx.default || mdjsx;

const MAX_MARKDOWN_STR_LENGTH = 50 * 1000 * 8;
const ExternalLink = (props) => React.createElement('a', { ...props, target: '_blank', rel: 'noopener' });
const options = { overrides: { a: { component: ExternalLink } }, disableParsingRawHTML: true };

const documents = JSON.parse(fs.readFileSync(0, 'utf8'));
const rendered = documents.map((content) => {
  const banner = content.length > MAX_MARKDOWN_STR_LENGTH
    ? '<div class="banner">This markdown is too large to render completely.</div>'
    : '';
  const body = React.createElement(Markdown, { options }, content.substr(0, MAX_MARKDOWN_STR_LENGTH));
  return banner + renderToStaticMarkup(body);
});
process.stdout.write(JSON.stringify(rendered));
