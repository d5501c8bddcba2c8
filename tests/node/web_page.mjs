// The chat page at "/" in headless Chromium (Debian's, driven by puppeteer-core):
//   node web_page.mjs BASE_URL DOCUMENT_FILE KEY SCREENSHOT.png [CHROMIUM]
// Pastes the document, asks for the pass key, reads the streamed answer and
// the stats off the page, asks again (the document then comes from the cache),
// and saves a screenshot. Exits 1 with a message on the first failed check.
import fs from "node:fs";

import { check, checks } from "./check.mjs";
import puppeteer from "puppeteer-core";

const [url, docPath, key, screenshot, chromium = "/usr/bin/chromium"] = process.argv.slice(2);
const doc = fs.readFileSync(docPath, "utf8");

const browser = await puppeteer.launch({
  executablePath: chromium, headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.setViewport({ width: 1100, height: 900 });
  await page.goto(url, { waitUntil: "networkidle0" });
  check((await page.title()) === "longctx", "the page loads");
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("demo"));
  // Paste: set the textarea as a paste would, then let the page hear it.
  await page.$eval("#document", (el, text) => {
    el.value = text;
    el.dispatchEvent(new Event("input"));
  }, doc);
  check((await page.$eval("#doc-size", (el) => el.textContent)).includes("characters"), "the page counts the document");

  async function ask(question, n) {
    await page.type("#question", question);
    await page.keyboard.press("Enter");
    await page.waitForFunction((n) => {
      const stats = document.querySelectorAll(".turn .stats");
      return stats.length === n && stats[n - 1].textContent.includes("tok/s");
    }, { timeout: 120000 }, n);
    return page.$$eval(".turn", (turns) => {
      const t = turns[turns.length - 1];
      return { answer: t.querySelector(".answer").textContent, stats: t.querySelector(".stats").textContent };
    });
  }
  const first = await ask("What is the pass key?", 1);
  check(first.answer.includes(key), "the streamed answer on the page has the pass key", JSON.stringify(first));
  check(/\(0 cached\)/.test(first.stats), "first question: nothing cached", first.stats);
  const second = await ask("Tell me the pass key again.", 2);
  check(second.answer.includes(key), "the second answer has the key", JSON.stringify(second));
  const cached = Number((second.stats.match(/\(([\d,]+) cached\)/) || ["", "0"])[1].replace(/,/g, ""));
  check(cached > 1000, "the second question reads the document from the cache", second.stats);
  check(errors.length === 0, "no script errors on the page", errors.join("\n"));
  await page.screenshot({ path: screenshot, fullPage: true });
  check(fs.statSync(screenshot).size > 1000, "screenshot saved", screenshot);
} finally {
  await browser.close();
}
console.log(`web_page: ${checks.passed} checks passed`);
